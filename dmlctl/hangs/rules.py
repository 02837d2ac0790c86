"""Deciding that a run hangs, and which rank holds it up. Pure: no clock, no I/O.

The controller turns each running rank's latest heartbeat into a :class:`RankView`
(ages already measured on its own clock) and asks :func:`find_hang`. The rules, in
order, with ``T`` the job's ``restart.hang_timeout``:

1. **Frozen.** A rank that sent no heartbeat for ``T`` seconds and whose process (as
   its host agent sees it) is stopped (SIGSTOP) or idle (an interpreter whose lock is
   never released): that rank. A silent rank that computes or does I/O — a long C call
   that holds the interpreter's lock, such as unpickling a large dataset — is busy.
2. **Phase over its limit.** A rank inside ``ctx.phase(name, limit=…)`` for longer
   than ``limit``: that rank.
3. **A collective that never completes.** A rank has waited in a collective for
   longer than its limit — ``max(T, STEP_FACTOR × its slowest recent step)``. The
   culprit is decided from the collective counts, not from who timed out first:
   the member of that process group that never entered it. If that rank waits in
   another collective itself, the chase goes on there (a cycle is reported as
   such). The culprit is hung only if it exited (and the waiter still waited in a
   beat sent after that), or is *stalled*: training steps
   are under way for it (armed), it is in no phase, its progress has stood still for
   its limit and it is idle (under :data:`BUSY_CORES` of CPU and :data:`BUSY_IO` of
   I/O over the recent window, as its host agent samples them).
   A culprit that computes, reads or writes, prepares data, evaluates or is in a
   phase is slow, not hung: no verdict. If every member of the group (all of them
   known) entered it and all still wait, idle, the collective itself never completes
   (a transfer that is merely slow keeps them busy).
4. **Everyone idle.** Every running worker is stalled or waits in a collective past
   its limit, and at least one is stalled: the one stalled longest.

Nothing else is a hang: a rank before its first step, after its data, in a phase, or
busy, is never blamed, however long it takes.

Before all that, a rank must start: one that has sent no heartbeat at all
:func:`start_limit` seconds after its attempt began is hung (:func:`find_unstarted`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dmlctl.protocol import NCCL_SUFFIX
from dmlctl.runs.events import Collective

BUSY_CORES = 0.1
"""CPU use (in cores, averaged over the recent window) above which a rank is working."""
BUSY_IO = 256 * 1024
"""I/O (bytes read and written per second, same window) above which a rank is working:
far above what an idle rank's own heartbeat writes."""
RUNNING_STATES = ("R", "D")
"""Process states (``/proc/PID/stat``) of a process that is under way: runnable, or
waiting for a disk."""
STEP_FACTOR = 4.0
"""A rank may take this many times its slowest recent step before it counts as stuck."""
START_BASE_S = 120.0
START_PER_RANK_S = 1.0
"""The default start timeout: :data:`START_BASE_S` plus this much per rank of the world
(more ranks share a host's cores and the run's store as they start)."""


@dataclass(frozen=True)
class RankView:
    """What the controller knows of one rank now (ages in seconds, on its clock)."""

    rank: int
    host: str
    role: str = "worker"
    beat_age: float = 0.0  # since its last heartbeat arrived
    stalled_for: float = 0.0  # since its progress last changed
    armed: bool = False
    phase: str | None = None
    phase_s: float | None = None
    limit: float | None = None
    step_s: float | None = None
    cpu_rate: float | None = None  # cores over the recent window; None: not known
    io_rate: float | None = None  # bytes read + written per second, same window
    proc_state: str | None = None  # its process's state letter (T: stopped)
    where: str | None = None
    inner: str | None = None
    coll: Mapping[str, Collective] = field(default_factory=dict)  # ages as of now
    exit_code: int | None = None  # set once the rank has exited
    exited_ago: float = 0.0  # since its exit was seen


@dataclass(frozen=True)
class Verdict:
    """A hang: ``rank`` on ``host`` holds the run up, for ``seconds``.

    ``reason`` is one of ``unstarted``, ``frozen``, ``phase``, ``stuck``, ``exited``,
    ``collective``, ``cycle``, ``idle``; ``detail`` says it in words without the frame; ``waiting``
    are the ranks that wait for the culprit; ``where``/``inner`` its last known frames.
    """

    rank: int
    host: str
    seconds: float
    reason: str
    detail: str
    waiting: tuple[int, ...] = ()
    where: str | None = None
    inner: str | None = None


def start_limit(start_timeout: float | None, world_size: int) -> float:
    """How long a rank may take to send its first heartbeat: the job's
    ``restart.start_timeout``, else :data:`START_BASE_S` + :data:`START_PER_RANK_S`
    per rank."""
    if start_timeout is not None:
        return start_timeout
    return START_BASE_S + START_PER_RANK_S * world_size


def find_unstarted(
    silent: Sequence[tuple[int, str]], age: float, start_timeout: float
) -> Verdict | None:
    """The first of the ``silent`` ranks ((rank, host): not one heartbeat yet) once its
    attempt began ``age`` seconds ago, at least ``start_timeout`` ago; else None."""
    if not silent or age < start_timeout:
        return None
    rank, host = min(silent)
    detail = (
        f"sent no heartbeat {age:.0f} s after its attempt began (restart.start_timeout "
        f"{start_timeout:g} s): it never started"
    )
    return Verdict(rank, host, age, "unstarted", detail)


def limit(view: RankView, hang_timeout: float) -> float:
    """How long ``view``'s rank may go without progress: ``max(T, k × slowest step)``."""
    return max(hang_timeout, STEP_FACTOR * (view.step_s or 0.0))


def busy(view: RankView) -> bool | None:
    """Whether ``view``'s process computes or does I/O (None: not known). A process the
    kernel holds runnable (``R``) or in disk I/O (``D``) is busy however little CPU it
    got: on a machine with far more ranks than cores (64 ranks importing torch on 2)
    each gets a few hundredths of a core, and is still under way, not hung."""
    if view.proc_state in RUNNING_STATES:
        return True
    if view.cpu_rate is None or view.io_rate is None:
        return None
    return view.cpu_rate >= BUSY_CORES or view.io_rate >= BUSY_IO


def stalled(view: RankView, hang_timeout: float) -> bool:
    """Armed, in no phase, no progress for its limit, and idle (see rule 3)."""
    return (
        view.exit_code is None
        and view.armed
        and view.phase is None
        and view.stalled_for >= limit(view, hang_timeout)
        and busy(view) is False
    )


def waiting_in(view: RankView, hang_timeout: float) -> tuple[str, Collective] | None:
    """The collective ``view``'s rank has waited in past its limit (the longest one)."""
    found = [
        (g, p)
        for g, p in view.coll.items()
        if p.age is not None and p.age >= limit(view, hang_timeout)
    ]
    return max(found, key=lambda gp: gp[1].age or 0.0) if found else None


def _group_label(group: str) -> str:
    """How a collective's group is named after it: nothing for the default group's
    gloo collectives, `` (NCCL)`` for its NCCL ones, else the group's name."""
    name, nccl = group.removesuffix(NCCL_SUFFIX), group.endswith(NCCL_SUFFIX)
    parts = ([f"group {name}"] if name != "0" else []) + (["NCCL"] if nccl else [])
    return f" ({', '.join(parts)})" if parts else ""


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _verdict(
    v: RankView, seconds: float, reason: str, detail: str, waiting: Sequence[int] = ()
) -> Verdict:
    return Verdict(v.rank, v.host, seconds, reason, detail, tuple(waiting), v.where, v.inner)


def find_hang(views: Sequence[RankView], hang_timeout: float) -> Verdict | None:
    """The hang among ``views`` by the module's rules, or None."""
    running = [v for v in views if v.exit_code is None]
    for v in running:
        if v.proc_state in ("Z", "X"):
            continue  # it died: torchrun reports how
        if v.beat_age >= hang_timeout and (v.proc_state in ("T", "t") or not busy(v)):
            state = {"T": "stopped", "t": "stopped by a tracer"}.get(v.proc_state or "", "idle")
            detail = f"sent no heartbeat for {v.beat_age:.0f} s; its process is {state}"
            return _verdict(v, v.beat_age, "frozen", detail)
    for v in running:
        if v.limit is not None and v.phase_s is not None and v.phase_s >= v.limit:
            detail = f"phase {v.phase!r} ran {v.phase_s:.0f} s, over its limit of {v.limit:g} s"
            return _verdict(v, v.phase_s, "phase", detail)
    by_rank = {v.rank: v for v in views}
    waiters = [(v, w) for v in running if (w := waiting_in(v, hang_timeout)) is not None]
    for v, (group, pending) in sorted(waiters, key=lambda vw: -(vw[1][1].age or 0.0)):
        verdict = _blame(v, group, pending, by_rank, hang_timeout, [])
        if verdict is not None:
            return verdict
    return _all_idle(running, hang_timeout)


def _blame(
    waiter: RankView,
    group: str,
    pending: Collective,
    by_rank: Mapping[int, RankView],
    hang_timeout: float,
    chain: list[tuple[int, str, int]],
) -> Verdict | None:
    """Who holds up collective ``completed + 1`` of ``group`` that ``waiter`` waits in."""
    seq, op = pending.completed + 1, pending.op or "collective"
    members = [m for m in by_rank.values() if group in m.coll]
    waiting = sorted(
        m.rank for m in members if m.coll[group].completed < seq <= m.coll[group].entered
    )
    missing = sorted((m for m in members if m.coll[group].entered < seq), key=lambda m: m.rank)
    age = pending.age or 0.0
    what = f"{op} #{seq}{_group_label(group)}"
    if not missing:
        stuck_in = [m for m in members if (w := waiting_in(m, hang_timeout)) and w[0] == group]
        size = max((m.coll[group].size for m in members), default=0)
        if len(stuck_in) < max(len(members), size) or any(busy(m) is not False for m in members):
            return None  # someone unknown, past it already, or still moving data
        first = by_rank[waiting[0]] if waiting else waiter
        detail = f"in {what} for {age:.0f} s; every rank of its group ({len(members)}) waits in it"
        return _verdict(first, age, "collective", detail, waiting)
    chain = [*chain, (waiter.rank, group, seq)]
    for m in missing:  # a rank that left, or sits idle outside any collective, first
        if m.exit_code is not None:
            if waiter.beat_age >= m.exited_ago:
                continue  # the waiter has not said since that it still waits: not certain
            detail = (
                f"exited (code {m.exit_code}) without entering {what}, which "
                f"{_ranks(waiting)} has waited in for {age:.0f} s"
            )
            return _verdict(m, age, "exited", detail, waiting)
        if waiting_in(m, hang_timeout) is None and stalled(m, hang_timeout):
            detail = f"never entered {what}, which {_ranks(waiting)} has waited in for {age:.0f} s"
            return _verdict(m, m.stalled_for, "stuck", detail, waiting)
    for m in missing:  # then those that wait in another collective themselves
        inner = waiting_in(m, hang_timeout)
        if inner is None or m.exit_code is not None:
            continue
        if any(rank == m.rank for rank, _, _ in chain):
            steps = "; ".join(f"rank {r} waits in #{s} of group {g}" for r, g, s in chain)
            return _verdict(m, age, "cycle", f"ranks wait for each other: {steps}", waiting)
        found = _blame(m, inner[0], inner[1], by_rank, hang_timeout, chain)
        if found is not None:
            return found
    return None


def _all_idle(running: Sequence[RankView], hang_timeout: float) -> Verdict | None:
    workers = [v for v in running if v.role != "server"]
    if not workers:
        return None
    idle = [v for v in workers if stalled(v, hang_timeout)]
    if not idle:
        return None
    if any(v not in idle and waiting_in(v, hang_timeout) is None for v in workers):
        return None
    v = max(idle, key=lambda x: (x.stalled_for, -x.rank))
    others = [w.rank for w in workers if w is not v]
    detail = f"no progress for {v.stalled_for:.0f} s and idle"
    if others:
        detail += f"; {_ranks(others)} stalled or waiting too"
    return _verdict(v, v.stalled_for, "idle", detail, others)
