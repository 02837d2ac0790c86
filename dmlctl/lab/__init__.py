"""``dmlctl lab``: a bandwidth-limited network of SSH hosts on this machine.

:func:`up` makes N network namespaces joined by veth pairs and a bridge
(:mod:`.net`), shapes every host's link both ways with ``tc`` (tbf, and netem for a
delay where the kernel has it), starts an ``sshd`` in each namespace with throw-away
keys (:mod:`.sshd`), and writes a cluster file and the hosts' known_hosts entries
(:mod:`.state`, :mod:`.known_hosts`). :func:`down` removes all of it, also without a
record. Traffic never leaves this machine. Root only. Never imports torch.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from dmlctl.errors import UsageError
from dmlctl.lab import known_hosts, names, net, sshd
from dmlctl.lab import slurm as slurm_lab
from dmlctl.lab.net import LabError
from dmlctl.lab.state import (
    LabHost,
    LabRecord,
    read_record,
    write_cluster,
    write_record,
    write_slurm_cluster,
)
from dmlctl.runs.store import dmlctl_home

__all__ = ["LabError", "default_dir", "down", "lab_network", "status", "up"]

Progress = Callable[[str], None]


def default_dir() -> Path:
    """``$DMLCTL_HOME/lab``."""
    return dmlctl_home() / "lab"


def up(
    n_hosts: int,
    bandwidth_bits: int,
    latency_ms: float | None,
    *,
    slots: int = 1,
    lab_dir: Path | None = None,
    force: bool = False,
    slurm: bool = False,
    progress: Progress = lambda _: None,
) -> Path:
    """Make the lab (after removing the previous one of ``lab_dir``) and return its
    cluster file. A lab of another directory is up: UsageError unless ``force`` (there
    is one network layout per machine, and its runs would be cut off). On any failure
    what was made is removed and LabError says why (UsageError for a host count out of
    range, or a delay without netem). With ``slurm``, a real Slurm runs over the
    hosts too (:mod:`.slurm`) and the returned cluster file is its ``slurm.yaml``."""
    lab_dir = (lab_dir or default_dir()).absolute()
    if not 1 <= n_hosts <= net.MAX_HOSTS:
        raise UsageError(f"--hosts {n_hosts}: a lab has 1 to {net.MAX_HOSTS} hosts")
    sshd.require_tools()
    if slurm:
        slurm_lab.require_tools()
    theirs = net.owner()
    if theirs not in (None, str(lab_dir)) and not force:
        whose = f"made for {theirs}" if theirs else "of unknown origin"
        raise UsageError(
            f"a lab {whose} is up; `dmlctl lab down` removes it (or `lab up --force` replaces it)"
        )
    down(lab_dir)
    net.check_subnet_free()
    if latency_ms is not None and not net.has_netem():
        raise UsageError("--latency needs the kernel's netem qdisc, which this kernel lacks")
    try:
        cluster = _make(n_hosts, bandwidth_bits, latency_ms, slots, lab_dir, progress)
        if not slurm:
            return cluster
        progress("Slurm: munge, slurmctld, a slurmd per host")
        conf = slurm_lab.start(lab_dir, n_hosts)
        return write_slurm_cluster(lab_dir, n_hosts, slots, conf)
    except BaseException:
        down(lab_dir)
        raise


def _make(
    n: int, bits: int, latency_ms: float | None, slots: int, lab_dir: Path, progress: Progress
) -> Path:
    lab_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    sshd.keygen(lab_dir / sshd.USER_KEY, "dmlctl-lab")
    progress(f"network: bridge {net.BRIDGE}, {n} namespaces")
    net.make_bridge(str(lab_dir))
    hosts = []
    for i in range(n):
        net.make_host(i)
        net.shape(i, bits, latency_ms)
        sshd.write_config(lab_dir, i)
        progress(f"lab-{i}: {net.address(i)}, starting sshd")
        pid = sshd.start(lab_dir, i)
        hosts.append(
            LabHost(
                name=f"lab-{i}", namespace=net.namespace(i), address=net.address(i), sshd_pid=pid
            )
        )
    for i, host in enumerate(hosts):
        sshd.wait_ready(lab_dir, i, host.sshd_pid)
    known_hosts.set_block(
        known_hosts.default_file(), [sshd.known_hosts_line(lab_dir, i) for i in range(n)]
    )
    names.set_block(names.lines(n))  # without it torch warns in every rank's log
    record = LabRecord(hosts=hosts, bandwidth_bits=bits, latency_ms=latency_ms, slots=slots)
    write_record(lab_dir, record)
    return write_cluster(lab_dir, record)


def down(lab_dir: Path | None = None) -> list[str]:
    """Remove the lab: processes in its namespaces (sshd and anything a run left),
    the namespaces, veths and bridge, its known_hosts block and directory. Idempotent;
    what was removed, in words."""
    lab_dir = lab_dir or default_dir()
    removed = slurm_lab.stop(lab_dir)
    removed += net.remove_network() if shutil.which("ip") else []
    hosts_file = known_hosts.default_file()
    if hosts_file.exists() and known_hosts.BEGIN in hosts_file.read_text(errors="replace"):
        known_hosts.set_block(hosts_file, [])
        removed.append(f"the lab's entries in {hosts_file}")
    if names.has_block() and names.set_block([]):
        removed.append(f"the lab's names in {names.HOSTS}")
    if lab_dir.exists():
        shutil.rmtree(lab_dir)
        removed.append(f"directory {lab_dir}")
    return removed


def status(lab_dir: Path | None = None) -> tuple[LabRecord | None, list[bool]]:
    """The lab's record (None: no lab) and whether each host's sshd answers now."""
    record = read_record(lab_dir or default_dir())
    if record is None:
        return None, []
    return record, [sshd.answers(h.address) for h in record.hosts]


@contextlib.contextmanager
def lab_network(
    n_hosts: int, bandwidth_bits: int, progress: Progress = lambda _: None
) -> Iterator[Path]:
    """A lab for the duration of the block (its cluster file), removed after. LabError
    when a lab is up already: it is the user's, and there is one network layout."""
    if net.lab_namespaces() or net.owner() is not None:
        raise LabError("a dmlctl lab is up already; `dmlctl lab down` first (it would be replaced)")
    cluster = up(n_hosts, bandwidth_bits, None, progress=progress)
    try:
        yield cluster
    finally:
        down()
