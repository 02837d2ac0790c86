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
its peers as a rank replaced on its own host does (:mod:`dmlctl.runtime.rejoin`) —
then waits for them as torchrun does: SIGTERM is passed on to every rank, and when
they have ended it exits 0 if each one did, else 1 after writing down the failed
ranks where the agent reads torchrun's (:func:`dmlctl.agent.torchrun.read_failures`).
Each rank dies with this process (it is their parent, or the zygote's child:
the entry's own promise). With ``ranks.start: warm`` the zygote forks them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType

from dmlctl import protocol, wire
from dmlctl.agent.rank_procs import FreshStarter, RankProcesses, Starter, shutdown_timeout
from dmlctl.agent_config import Rejoin

ENV_STANDIN = "DMLCTL_STANDIN"
"""The ranks to start, as :meth:`dmlctl.agent_config.Rejoin.standin_env` writes them."""
POLL_S = 0.1


@dataclass(frozen=True)
class Order:
    """What the stand-in starts: the lost ranks (:class:`Rejoin`), the run's id, its
    restart budget and the script with its arguments."""

    rejoin: Rejoin
    run_id: str
    script: str
    args: tuple[str, ...]
    max_restarts: int = 0

    @staticmethod
    def from_json(text: str) -> Order:
        """:data:`ENV_STANDIN`'s value read back (``KeyError``/``ValueError`` else)."""
        data = json.loads(text)
        args = tuple(str(a) for a in data["args"])
        return Order(
            Rejoin.from_dict(data["rejoin"]),
            str(data["run_id"]),
            str(data["script"]),
            args,
            int(data.get("max_restarts", 0)),
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
        "TORCHELASTIC_RESTART_COUNT": str(protocol.restarts_before(base)),
        "TORCHELASTIC_MAX_RESTARTS": str(order.max_restarts),
        "TORCHELASTIC_RUN_ID": order.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_ERROR_FILE": os.path.join(rank_dir, f"standin-error-{rank}.json"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        protocol.ENV_REJOIN: str(spec.number),
    }


def start_ranks(order: Order, env: Mapping[str, str], starter: Starter) -> RankProcesses:
    """Every rank of ``order`` started by ``starter``, each in a session of its own,
    a rank killed by SIGKILL started again in place (:mod:`dmlctl.agent.respawn`)."""
    argv = (sys.executable, "-u", "-m", "dmlctl.runtime.entry", order.script, *order.args)
    commands = {lr: (argv, rank_env(order, lr, env)) for lr in range(len(order.rejoin.ranks))}
    return RankProcesses(starter, commands, respawn_lost=True)


def wait_all(procs: RankProcesses, count: int, stopping: list[int]) -> dict[int, int]:
    """Each local rank's exit code once all ``count`` have ended; the ranks are
    stopped (SIGTERM, SIGKILL after the shutdown timeout) when ``stopping`` gets a
    signal number."""
    while len(ended := procs.ended()) < count:
        if stopping:
            procs.close(signal.SIGTERM, shutdown_timeout())
            return procs.ended()
        time.sleep(POLL_S)
    return ended


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


def main(starter: Starter | None = None) -> int:
    """Start the ranks of :data:`ENV_STANDIN` with ``starter`` (None: new
    interpreters), wait for them; 0 when each ended with 0."""
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    order = Order.from_json(os.environ[ENV_STANDIN])
    procs = start_ranks(order, os.environ, starter or FreshStarter())
    ranks = ", ".join(str(r) for r in order.rejoin.ranks)
    print(f"dmlctl standin: started rank {ranks} into the running world", flush=True)
    codes = wait_all(procs, len(order.rejoin.ranks), stopping)
    pids = procs.pids()
    by_rank = {order.rejoin.ranks[lr]: code for lr, code in codes.items()}
    write_failures(by_rank, {order.rejoin.ranks[lr]: pid for lr, pid in pids.items()})
    return 0 if all(code == 0 for code in codes.values()) and len(codes) == len(pids) else 1


if __name__ == "__main__":
    sys.exit(main())
