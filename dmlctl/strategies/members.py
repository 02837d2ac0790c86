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

from dmlctl.failure import lost_after_training
from dmlctl.runtime import rejoin
from dmlctl.runtime.signed_store import SignedStore

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


def agree(
    store: SignedStore, generation: int, rank: int, world: int, wait: float
) -> tuple[int, ...]:
    """The members of ``generation`` (worker ranks, ascending), as the first member
    to decide wrote them: every worker not gone and not finished once all are there,
    or those there after ``wait`` seconds. Marks the workers left out gone (not those
    whose process ended: a finished worker stays finished)."""
    decided = rejoin.key(f"elastic/{generation}/members")
    if store.check([rejoin.gone_key(rank)]):  # back after the others went on
        store.delete_key(rejoin.gone_key(rank))
        store.delete_key(rejoin.done_key(rank))  # torchruns wait for it again
    store.set(_in(generation, rank), "1")
    deadline = time.monotonic() + wait
    while not store.check([decided]):
        came = [r for r in range(world) if store.check([_in(generation, r)])]
        awaited = [r for r in range(world) if r not in came and not _ended(store, r)]
        if not awaited or time.monotonic() >= deadline:
            store.compare_set(decided, "", json.dumps(came))
            break
        time.sleep(POLL_S)
    members = tuple(int(r) for r in json.loads(store.get(decided)))
    for r in range(world):
        if r not in members and r != rank and not _ended(store, r):
            store.set(rejoin.gone_key(r), "1")
            store.set(rejoin.done_key(r), "1")  # torchruns stop waiting for it
    return members


def _ended(store: SignedStore, rank: int) -> bool:
    """Whether worker ``rank``, not there yet, will never come to a generation: it is
    gone (the others went on without it) or its process ended
    (:func:`dmlctl.runtime.rejoin.done`)."""
    return store.check([rejoin.gone_key(rank)]) or store.check([rejoin.done_key(rank)])


def end_if_run_over(store: SignedStore, rank: int, world: int) -> None:
    """In a replacement of worker ``rank`` that found no model to take: when every
    other worker has ended its process (at least one finished, not left out), the
    run's last collectives are over and no round is left to join. Its predecessor's
    part was over (its script had ended: :func:`~dmlctl.runtime.rejoin.finished_key`):
    :class:`PartOver`, this process ends as finished. Else it was lost in what its
    script does after training (an evaluation, a save): :class:`LostAfterTraining`,
    and the run restarts as a whole — as on a worker's own host
    (:mod:`dmlctl.agent.respawn`)."""
    others = [r for r in range(world) if r != rank]
    if not store.check([rejoin.done_key(r) for r in others]):  # true when all are set
        return
    if store.check([rejoin.gone_key(r) for r in others]):
        return  # every other one was lost: nobody finished the run
    if not store.check([rejoin.finished_key(rank)]):
        since = ", and every other worker has finished since"
        raise LostAfterTraining(lost_after_training(rank, since))
    rejoin.say(
        f"rank {rank} started again after its part of the run was over (its script had "
        "ended, and every other worker has finished): counted as finished"
    )
    raise PartOver(0)


class PartOver(SystemExit):
    """A replacement of a worker whose part of the run was over: nothing is left for
    it, and its process ends as finished (raised with exit code 0)."""


class InPlaceLost(RuntimeError):
    """In-place recovery cannot go on (every worker that held the model was lost, or
    a loss left the workers at steps no round joins): the run restarts as a whole from
    its newest checkpoint, within its restart budget (an infrastructure failure)."""

    def __init__(self, generation: int, what: str) -> None:
        super().__init__(
            f"generation {generation}: {what}; in-place recovery cannot go on, so the run "
            "restarts as a whole (from its newest checkpoint, if it has one)"
        )


class LostAfterTraining(RuntimeError):
    """A replacement of a worker lost after its training, once every other worker has
    finished: the run restarts as a whole (an infrastructure failure)."""


def _in(generation: int, rank: int) -> str:
    return rejoin.key(f"elastic/{generation}/in/{rank}")
