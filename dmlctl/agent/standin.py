"""``python -m dmlctl.agent.standin``: a lost host's ranks started on another host
into the running world, in torchrun's place (``restart.mode: in_place``).

torchrun cannot start a few ranks into a world that has met: a new node makes every
node's torchrun stop its ranks and meet again (a full restart). So when a host is
lost and the run replaces lost workers in place, the controller has a spare host's
agent (or the lost host's, when it is back) run this instead of torchrun
(:class:`dmlctl.agent_config.Rejoin`, in :data:`ENV_STANDIN`): it starts each lost
rank as torchrun would have — ``python -u -m dmlctl.runtime.entry SCRIPT ARGS…`` with
the variables torchrun gives a rank (its global rank, the world's size, the run's
store at ``MASTER_ADDR:MASTER_PORT``) and ``DMLCTL_REJOIN`` set, so that each one joins
its peers as a replacement forked in place does (:mod:`dmlctl.runtime.rejoin`) —
then waits for them as torchrun does: SIGTERM is passed on to every rank, and when
they have ended it exits 0 if each one did, else 1 after writing down the failed
ranks where the agent reads torchrun's (:func:`dmlctl.agent.torchrun.read_failures`).
Each rank dies with this process (it is their parent: the entry's own promise).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

from dmlctl import protocol, wire
from dmlctl.agent.procs import dies_with_parent
from dmlctl.agent_config import Rejoin

ENV_STANDIN = "DMLCTL_STANDIN"
"""The ranks to start, as :meth:`dmlctl.agent_config.Rejoin.standin_env` writes them."""
POLL_S = 0.1


@dataclass(frozen=True)
class Order:
    """What the stand-in starts: the lost ranks (:class:`Rejoin`), the rendezvous id
    and the script with its arguments."""

    rejoin: Rejoin
    run_id: str
    script: str
    args: tuple[str, ...]

    @staticmethod
    def from_json(text: str) -> Order:
        """:data:`ENV_STANDIN`'s value read back (``KeyError``/``ValueError`` else)."""
        data = json.loads(text)
        args = tuple(str(a) for a in data["args"])
        return Order(
            Rejoin.from_dict(data["rejoin"]), str(data["run_id"]), str(data["script"]), args
        )


def rank_env(order: Order, local_rank: int, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of the ``local_rank``-th rank of ``order``: ``base`` and what
    torchrun gives each rank, its error file in the rank directory, and
    ``DMLCTL_REJOIN``."""
    spec = order.rejoin
    rank, world = spec.ranks[local_rank], str(spec.world_size)
    rank_dir = base.get(protocol.ENV_RANK_DIR, ".")
    return {
        **{k: v for k, v in base.items() if k != ENV_STANDIN},
        "LOCAL_RANK": str(local_rank),
        "RANK": str(rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "GROUP_RANK": str(spec.group_rank),
        "GROUP_WORLD_SIZE": str(spec.group_world_size),
        "LOCAL_WORLD_SIZE": str(len(spec.ranks)),
        "WORLD_SIZE": world,
        "ROLE_WORLD_SIZE": world,
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(spec.master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": order.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_ERROR_FILE": os.path.join(rank_dir, f"standin-error-{rank}.json"),
        protocol.ENV_REJOIN: str(spec.number),
    }


class Rank(Protocol):
    """A started rank: a new interpreter's :class:`subprocess.Popen`, or a
    :class:`~dmlctl.agent.forked_rank.ForkedRank`."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...


def start_ranks(order: Order, env: Mapping[str, str], fork: bool) -> dict[int, Rank]:
    """Every rank of ``order`` started (global rank → process), each its own process
    group and dying with this process: forked from it when ``fork`` (a warm agent's
    child, torch imported) and the rank's environment allows, as torchrun's ranks are
    (:mod:`dmlctl.agent.forked_rank`; one killed by SIGKILL is then forked again in
    place), else a new interpreter."""
    from dmlctl.agent import forked_rank

    argv = [sys.executable, "-u", "-m", "dmlctl.runtime.entry", order.script, *order.args]
    if fork:
        forked_rank.warm_runtime()
    procs: dict[int, Rank] = {}
    for local_rank, rank in enumerate(order.rejoin.ranks):
        own = rank_env(order, local_rank, env)
        if fork and forked_rank.can_fork(argv, own):
            procs[rank] = forked_rank.ForkedRank(argv, own, None, None)
            continue
        procs[rank] = subprocess.Popen(
            argv,
            env=own,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # as torchrun's: signalled as a group
            preexec_fn=dies_with_parent(signal.SIGKILL, os.getpid()),
        )
    return procs


def wait_all(procs: Mapping[int, Rank], stopping: list[int]) -> dict[int, int]:
    """Each rank's exit code once all have ended; SIGTERM to each one that still runs
    when ``stopping`` gets a signal number (then SIGKILL after the shutdown timeout)."""
    sent_at: float | None = None
    grace = float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
    while any(p.poll() is None for p in procs.values()):
        if stopping and sent_at is None:
            sent_at = time.monotonic()
            _signal_all(procs, signal.SIGTERM)
        if sent_at is not None and time.monotonic() - sent_at > grace:
            _signal_all(procs, signal.SIGKILL)
        time.sleep(POLL_S)
    return {rank: int(p.returncode or 0) for rank, p in procs.items()}


def _signal_all(procs: Mapping[int, Rank], sig: int) -> None:
    """``sig`` to every rank still running and its group; a forked rank is told first
    that it is being stopped (it is not forked again)."""
    for p in procs.values():
        if p.poll() is None:
            stopping = getattr(p, "stopping", None)
            if stopping is not None:
                stopping()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)


def write_failures(codes: Mapping[int, int], pids: Mapping[int, int]) -> None:
    """The ranks that failed, where the agent reads torchrun's (nothing when none did)."""
    rank_dir = os.environ.get(protocol.ENV_RANK_DIR)
    failed = [
        wire.RankFailure(rank, code, pids[rank], time.time())
        for rank, code in sorted(codes.items())
        if code != 0
    ]
    if not rank_dir or not failed:
        return
    path = protocol.torchrun_failures(rank_dir, os.environ.get(protocol.ENV_ATTEMPT, "1"))
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as out:
        out.write(wire.encode_failures(failed))


def main(fork: bool = False) -> int:
    """Start the ranks of :data:`ENV_STANDIN` (forked from this process when ``fork``:
    a warm agent's child), wait for them; 0 when each ended with 0."""
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    procs = start_ranks(Order.from_json(os.environ[ENV_STANDIN]), os.environ, fork)
    ranks = ", ".join(str(r) for r in procs)
    print(f"dmlctl standin: started rank {ranks} into the running world", flush=True)
    codes = wait_all(procs, stopping)
    write_failures(codes, {rank: p.pid for rank, p in procs.items()})
    return 0 if all(code == 0 for code in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
