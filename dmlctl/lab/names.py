"""The lab's block in ``/etc/hosts``: a name for every address of the lab network
(``dmlctl-lab-<i>``, and ``dmlctl-lab-gateway`` for this machine's end), each also in
its IPv4-mapped IPv6 form (which torch's sockets see), so that a lookup of a peer's
name by its address (torch's c10d makes one for every connection) finds one instead of
warning in every rank's log. Between the same markers as the known_hosts block
(:mod:`dmlctl.lab.known_hosts`): ``lab down`` removes exactly what ``up`` added; other
lines are kept as they are. Written in place (the file may be a bind mount, which
cannot be replaced)."""

from __future__ import annotations

from pathlib import Path

from dmlctl.lab import net
from dmlctl.lab.known_hosts import BEGIN, END, without_block

HOSTS = Path("/etc/hosts")


def lines(n_hosts: int) -> list[str]:
    """The block's lines for a lab of ``n_hosts`` hosts."""
    named = [(net.gateway(), f"{net.NS_PREFIX}gateway")]
    named += [(net.address(i), net.namespace(i)) for i in range(n_hosts)]
    # torch's sockets are IPv6 ones that reach IPv4 peers at v4-mapped addresses: both
    return [f"{a} {name}" for address, name in named for a in (address, f"::ffff:{address}")]


def set_block(block: list[str], path: Path = HOSTS) -> bool:
    """``path`` with the lab's block replaced by ``block`` (removed when empty); False
    when the file cannot be written (then nothing changed)."""
    try:
        with open(path, "r+", encoding="utf-8") as f:
            kept = without_block(f.read())
            if block:
                kept += (
                    ("" if not kept or kept.endswith("\n") else "\n")
                    + "\n".join([BEGIN, *block, END])
                    + "\n"
                )
            f.seek(0)
            f.write(kept)
            f.truncate()
    except OSError:
        return False
    return True


def has_block(path: Path = HOSTS) -> bool:
    try:
        return BEGIN in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
