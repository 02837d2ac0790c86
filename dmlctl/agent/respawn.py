"""Which dead rank dmlctl's elastic agent starts again in place (``restart.mode:
in_place``).

A worker that the system killed (SIGKILL: the OOM killer, ``kill -9``) is started
again by :class:`~dmlctl.agent.rank_procs.RankProcesses` while torchrun and every
other rank go on, at most ``DMLCTL_RESPAWNS`` times per rank; the replacement has
``DMLCTL_REJOIN`` set and joins the running world (:mod:`dmlctl.runtime.rejoin`).
So is a parameter server (``DMLCTL_RESPAWN_SERVERS``): it starts from its newest
snapshot (:mod:`dmlctl.ps.serve`). A rank that failed by itself (an exception, a crash
signal), or any rank while torchrun stops its workers, is never started again:
torchrun sees its end as before.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping

from dmlctl import protocol
from dmlctl.failure import lost_after_training


def may_respawn(env: Mapping[str, str], code: int, done: int) -> bool:
    """Whether a rank started with ``env`` that ended with ``code`` (``-N``: signal N)
    is started again, ``done`` times already: a worker of an in-place run (or a server,
    where ``DMLCTL_RESPAWN_SERVERS`` says they can be), killed by SIGKILL within its
    budget, whose part was not over (no ``.finished`` mark) nor its training (no
    ``.trained`` mark: after it, its peers are past every round it could rejoin —
    said on stderr; the run then restarts as a whole)."""
    if not protocol.in_place(env) or code != -signal.SIGKILL:
        return False
    try:
        role = protocol.local_role(env, int(env.get("LOCAL_RANK", "0")))
        limit = int(env.get(protocol.ENV_RESPAWNS, "0"))
    except ValueError:
        return False
    servers = env.get(protocol.ENV_RESPAWN_SERVERS) == "1"
    replaceable = role == protocol.ROLE_WORKER or (servers and role == protocol.ROLE_SERVER)
    if not replaceable or done >= limit or _marked(env, protocol.rank_finished):
        return False
    if _marked(env, protocol.rank_trained):
        print(f"dmlctl: {lost_after_training(env.get('RANK'))}", file=sys.stderr)
        return False
    return True


def over_before(env: Mapping[str, str], code: int) -> bool:
    """Whether a worker of an in-place run killed by SIGKILL (``code``) had ended its
    part before (the ``.finished`` mark: its last collective and the comparison of
    the final models were done): nothing to replace, and no failure of the run
    either. Said on stderr when so."""
    over = (
        protocol.in_place(env) and code == -signal.SIGKILL and _marked(env, protocol.rank_finished)
    )
    if over:
        print(
            f"dmlctl: rank {env.get('RANK')} was killed by SIGKILL after its part of the "
            "run was over (its final model was compared); counted as finished",
            file=sys.stderr,
        )
        _write(env, lambda writer: writer.exit(0, None))  # it could not write its own
        _done_with_store(env)
    return over


def _done_with_store(env: Mapping[str, str]) -> None:
    """Say for the rank started with ``env`` that it is done with the run's store, as
    it would have as it ended (:func:`dmlctl.runtime.rejoin.done`): the torchruns wait
    for that. Said on stderr when the store cannot be reached."""
    from datetime import timedelta

    from dmlctl import run_key
    from dmlctl.runtime import rejoin
    from dmlctl.runtime.signed_store import SignedStore

    if "MASTER_ADDR" not in env:  # no store (a rank run by hand)
        return
    try:
        raw = rejoin.connect(env["MASTER_ADDR"], int(env["MASTER_PORT"]), timedelta(seconds=10))
        SignedStore(raw, run_key.key(env)).set(rejoin.done_key(int(env.get("RANK", "0"))), "1")
    except (KeyError, ValueError, RuntimeError) as exc:
        print(f"dmlctl: rank {env.get('RANK')}: the run's store: {exc}", file=sys.stderr)


def _marked(env: Mapping[str, str], mark: Callable[[str, int, str], str]) -> bool:
    """Whether the rank started with ``env`` left ``mark`` (a path of
    :mod:`dmlctl.protocol`) in this attempt."""
    rank_dir = env.get(protocol.ENV_RANK_DIR)
    attempt = env.get(protocol.ENV_ATTEMPT, "1")
    rank = env.get("RANK", "0")
    return bool(rank_dir) and os.path.exists(mark(str(rank_dir), int(rank), attempt))


def rejoin_env(env: Mapping[str, str], number: int) -> dict[str, str]:
    """The environment of the ``number``-th replacement (1 for the first)."""
    return {**env, protocol.ENV_REJOIN: str(number)}


def record(env: Mapping[str, str], code: int, pid: int) -> None:
    """Write the rank's ``respawn`` record (its old process ended with ``code``, the
    new one is ``pid``) where the host agent reads the rank's records; one that
    cannot be written is said on stderr (torchrun goes on)."""
    _write(env, lambda writer: writer.respawn(code, pid))


def _write(env: Mapping[str, str], write: Callable[[protocol.RankEventWriter], None]) -> None:
    """``write`` a record of the rank started with ``env`` where the host agent reads
    its records; one that cannot be written is said on stderr (torchrun goes on)."""
    rank_dir = env.get(protocol.ENV_RANK_DIR)
    if not rank_dir:
        return
    try:
        writer = protocol.RankEventWriter(rank_dir, int(env.get("RANK", "0")))
        try:
            write(writer)
        finally:
            writer.close()
    except (OSError, ValueError) as exc:
        print(f"dmlctl: a record of rank {env.get('RANK')}: {exc}", file=sys.stderr)
