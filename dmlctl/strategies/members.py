"""Who is in a generation of the elastic group (:mod:`dmlctl.strategies.elastic`):
every worker, or — where the run lets it (``restart.rejoin_wait``) — those that
came within that many seconds.

Each member says in the run's store that it is in generation ``g``; the first to see
every worker there, or to wait ``rejoin_wait`` seconds, writes the member list (a
compare-and-set: the first list written is everyone's). A worker left out is
*gone* from the run: its key says so (the workers' store collectives stop waiting for
it, :class:`~dmlctl.runtime.rejoin.StoreGroup`) and so does its done key (torchrun
stops waiting for it at its exit). A worker that comes after the list was written
(a late replacement) is not a member of ``g``: it breaks ``g`` and forms ``g + 1``,
where the others meet it.
"""

from __future__ import annotations

import json
import time

from torch._C._distributed_c10d import Store

from dmlctl.runtime import rejoin

POLL_S = 0.05
_LOST = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Read error",
    "Broken pipe",
    "connectFullMesh failed",  # a member died as the group formed (connection refused)
)


class Replaced(RuntimeError):
    """A newer process runs this worker's rank: this one must not go on."""


class MemberLost(Exception):
    """Another member found this generation's group broken."""


def member_lost(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a collective, says a member's connection broke (its
    process died) rather than something else going wrong, or is :class:`MemberLost`."""
    return isinstance(exc, MemberLost) or any(mark in str(exc) for mark in _LOST)


def agree(store: Store, generation: int, rank: int, world: int, wait: float) -> tuple[int, ...]:
    """The members of ``generation`` (worker ranks, ascending), as the first member
    to decide wrote them: every worker not gone once all are there, or those there
    after ``wait`` seconds. Marks the workers left out gone."""
    decided = rejoin.key(f"elastic/{generation}/members")
    if store.check([rejoin.gone_key(rank)]):  # back after the others went on
        store.delete_key(rejoin.gone_key(rank))
        store.delete_key(rejoin.done_key(rank))  # torchruns wait for it again
    store.set(_in(generation, rank), "1")
    expected = [r for r in range(world) if r == rank or not store.check([rejoin.gone_key(r)])]
    deadline = time.monotonic() + wait
    while not store.check([decided]):
        present = [r for r in expected if store.check([_in(generation, r)])]
        if len(present) == len(expected) or time.monotonic() >= deadline:
            store.compare_set(decided, "", json.dumps(present))
            break
        time.sleep(POLL_S)
    members = tuple(int(r) for r in json.loads(store.get(decided)))
    for r in range(world):
        if r not in members and r != rank and not store.check([rejoin.gone_key(r)]):
            store.set(rejoin.gone_key(r), "1")
            store.set(rejoin.done_key(r), "1")  # torchruns stop waiting for it
    return members


def _in(generation: int, rank: int) -> str:
    return rejoin.key(f"elastic/{generation}/in/{rank}")
