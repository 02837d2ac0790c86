"""Which dead rank the warm torchrun forks again in place (``restart.mode: in_place``).

A worker of a parameter-server strategy that the system killed (SIGKILL: the OOM
killer, ``kill -9``) is forked again by :class:`~dmlctl.agent.forked_rank.ForkedRank`
while torchrun and every other rank go on, at most ``DMLCTL_RESPAWNS`` times per
rank; the replacement has ``DMLCTL_REJOIN`` set and joins the running world
(:mod:`dmlctl.runtime.rejoin`). A rank that failed by itself (an exception, a crash
signal), a server, or any rank while torchrun stops its workers is never forked
again: torchrun sees its end as before.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping

from dmlctl import protocol


def may_respawn(env: Mapping[str, str], code: int, done: int) -> bool:
    """Whether a rank started with ``env`` that ended with ``code`` (``-N``: signal N)
    is forked again, ``done`` times already."""
    if env.get(protocol.ENV_RESTART_MODE) != protocol.IN_PLACE or code != -signal.SIGKILL:
        return False
    try:
        role = protocol.local_role(env, int(env.get("LOCAL_RANK", "0")))
        limit = int(env.get(protocol.ENV_RESPAWNS, "0"))
    except ValueError:
        return False
    return role == protocol.ROLE_WORKER and done < limit


def rejoin_env(env: Mapping[str, str], number: int) -> dict[str, str]:
    """The environment of the ``number``-th replacement (1 for the first)."""
    return {**env, protocol.ENV_REJOIN: str(number)}


def record(env: Mapping[str, str], code: int, pid: int) -> None:
    """Write the rank's ``respawn`` record (its old process ended with ``code``, the
    new one is ``pid``) where the host agent reads the rank's records."""
    rank_dir = env.get(protocol.ENV_RANK_DIR)
    if not rank_dir:
        return
    writer = protocol.RankEventWriter(rank_dir, int(env.get("RANK", "0")))
    try:
        writer.respawn(code, pid)
    finally:
        writer.close()
