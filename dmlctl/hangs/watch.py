"""Liveness of an attempt, seen from the controller: hosts that stop sending anything
(cut off), ranks that hang (:mod:`dmlctl.hangs.rules` decides), and the
investigation between a hang verdict and the root cause (stack dumps).

Everything is measured on the controller's own clock, so clock skew between hosts
never counts: a heartbeat is dated when it arrives, a host's silence since its last
line arrived, a rank's progress since the beat that changed it.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dmlctl.failure import Evidence, Failure, Kind
from dmlctl.hangs.rules import RankView, Verdict, find_hang, find_unstarted
from dmlctl.runs.events import (
    Heartbeat,
    MetricRecord,
    ProcSample,
    ProcUsage,
    RankExited,
    StackDump,
    StacksDumped,
)
from dmlctl.runs.state import RankStatus, RunState

CPU_WINDOW_S = 5.0
"""A rank's CPU use is averaged over its beats of this many recent seconds."""
DUMP_WAIT_S = 3.0
"""How long a hang verdict waits for the hosts' stack dumps before it is reported."""
CONFIRM_S = 1.2
"""A verdict is judged again this long after it was made (a heartbeat interval and
some), on newer beats, before it becomes the root cause."""
STALE_BEAT_S = 3.0
"""A rank silent for this long (exiting, or frozen) tells nothing about its collectives
or CPU any more: its views keep its counts but no ages or rates."""


class Liveness:
    """Hosts: call :meth:`reset` when an attempt starts, :meth:`heard` for every line
    from a host; :meth:`silent` says who stopped (``None`` timeout: never)."""

    def __init__(self, host_timeout: float | None) -> None:
        self.host_timeout = host_timeout
        self._last_seen: dict[str, float] = {}  # host → monotonic time of its last line

    def reset(self, hosts: Iterable[str]) -> None:
        """A new attempt starts on ``hosts``: every host heard now."""
        self._last_seen = dict.fromkeys(hosts, time.monotonic())

    def heard(self, host: str) -> None:
        """A line arrived from ``host``."""
        self._last_seen[host] = time.monotonic()

    def shift(self, seconds: float) -> None:
        """The controller stood still for ``seconds``: not the hosts' silence."""
        self._last_seen = {h: t + seconds for h, t in self._last_seen.items()}

    def silent(self, hosts: Iterable[str]) -> list[str]:
        """Hosts among ``hosts`` that sent nothing for ``host_timeout`` seconds."""
        if self.host_timeout is None:
            return []
        now = time.monotonic()
        limit = self.host_timeout
        return [h for h in sorted(hosts) if now - self._last_seen.get(h, now) > limit]


@dataclass
class _Track:
    """What the controller keeps of one rank's heartbeats."""

    last: Heartbeat
    beat_at: float
    progress_at: float


@dataclass
class _Usage:
    """A rank's process as its agent samples it: the newest state and the recent
    (time, CPU seconds, I/O bytes) samples."""

    state: str = ""
    samples: collections.deque[tuple[float, float, int]] = field(default_factory=collections.deque)

    def add(self, now: float, usage: ProcUsage) -> None:
        self.state = usage.state
        self.samples.append((now, usage.cpu, usage.io))
        while len(self.samples) > 2 and self.samples[1][0] <= now - CPU_WINDOW_S:
            self.samples.popleft()

    def rates(self, now: float) -> tuple[float, float] | None:
        """(cores, I/O bytes per second) over the recent window, or None with too short
        or too old a history."""
        s = self.samples
        if len(s) < 2 or s[-1][0] - s[0][0] < CPU_WINDOW_S / 2 or now - s[-1][0] > STALE_BEAT_S:
            return None
        (t0, c0, b0), (t1, c1, b1) = s[0], s[-1]
        span = max(t1 - t0, 1e-9)
        return max(0.0, c1 - c0) / span, max(0, b1 - b0) / span


class HangWatch:
    """Ranks: call :meth:`reset` when an attempt starts and :meth:`beat` for every
    heartbeat; :meth:`check` returns a verdict once per attempt (``None`` timeout:
    never). ``clock`` is the monotonic clock beats are dated with. ``start_timeout``:
    seconds from :meth:`reset` to a rank's first heartbeat (None: never judged)."""

    def __init__(
        self,
        hang_timeout: float | None,
        clock: Callable[[], float] = time.monotonic,
        start_timeout: float | None = None,
    ) -> None:
        self.hang_timeout = hang_timeout
        self.start_timeout = start_timeout
        self.clock = clock
        self._began = clock()
        self._ranks: dict[int, _Track] = {}
        self._usage: dict[int, _Usage] = {}
        self._exits: dict[int, float] = {}  # rank → when its exit arrived
        self._reported = False

    def reset(self) -> None:
        self._ranks, self._usage, self._exits = {}, {}, {}
        self._reported = False
        self._began = self.clock()

    def exited(self, ev: RankExited) -> None:
        """A rank's exit arrived (now), with its final collective counts if it sent them."""
        self._exits.setdefault(ev.rank, self.clock())
        track = self._ranks.get(ev.rank)
        if track is not None and ev.coll:
            track.last = dataclasses.replace(track.last, coll=ev.coll)

    def beat(self, ev: Heartbeat) -> None:
        now = self.clock()
        track = self._ranks.get(ev.rank)
        if track is None:
            track = self._ranks[ev.rank] = _Track(ev, now, now)
        elif ev.progress != track.last.progress:
            track.progress_at = now
        track.last, track.beat_at = ev, now

    def recorded(self, ev: MetricRecord) -> None:
        """A rank's metric record (a ``ctx.log`` call) newer than its latest heartbeat:
        the rank moved on since that beat (it beats once a second), so the beat's
        seconds-since-step and pending collectives are stale: until its next beat the
        rank counts as having progressed now. (Without this, a rank's last beat from a
        long wait, read after a peer exited, looked like a rank idle without steps.)"""
        track = self._ranks.get(ev.rank)
        if track is None or ev.ts <= track.last.ts:
            return
        track.progress_at = self.clock()
        track.last = dataclasses.replace(track.last, since=None, coll={})

    def sample(self, ev: ProcSample) -> None:
        """The agent's look at its ranks' processes (state, CPU, I/O)."""
        now = self.clock()
        for rank, usage in ev.procs.items():
            self._usage.setdefault(rank, _Usage()).add(now, usage)

    def shift(self, seconds: float) -> None:
        """The controller itself stood still for ``seconds`` (its loop was blocked):
        nothing could arrive meanwhile, so no rank counts that time as silence."""
        for track in self._ranks.values():
            track.beat_at += seconds
        for usage in self._usage.values():
            usage.samples = collections.deque((t + seconds, c, b) for t, c, b in usage.samples)

    def views(self, state: RunState) -> list[RankView]:
        """A view of every rank that has sent a heartbeat in this attempt."""
        now = self.clock()
        out = []
        for r in state.ranks:
            track = self._ranks.get(r.rank)
            if track is None or r.status in (RankStatus.PENDING, RankStatus.DROPPED):
                continue  # a dropped rank's host is gone: its silence is no hang
            b, age = track.last, now - track.beat_at
            fresh = age <= STALE_BEAT_S
            coll = {
                g: dataclasses.replace(c, age=c.age + age if c.age is not None and fresh else None)
                for g, c in b.coll.items()
            }
            # The rank's own count of seconds since its last step is exact; the time
            # since its progress changed on arrival is late by up to a beat.
            stalled = b.since + age if b.since is not None else now - track.progress_at
            usage = self._usage.get(r.rank)
            rates = usage.rates(now) if usage is not None else None
            out.append(
                RankView(
                    rank=r.rank,
                    host=r.host,
                    role=r.role,
                    beat_age=age,
                    stalled_for=stalled,
                    armed=b.armed,
                    phase=b.phase,
                    phase_s=None if b.phase_s is None else b.phase_s + age,
                    limit=b.limit,
                    step_s=b.step_s,
                    cpu_rate=rates[0] if rates else None,
                    io_rate=rates[1] if rates else None,
                    proc_state=usage.state if usage is not None else None,
                    where=b.where,
                    inner=b.inner,
                    coll=coll,
                    exit_code=r.exit_code if r.status.terminal else None,
                    exited_ago=now - self._exits.get(r.rank, now),
                )
            )
        return out

    def check(self, state: RunState) -> Verdict | None:
        """The run's hang (see :mod:`dmlctl.hangs.rules`), reported once per attempt
        (unless :meth:`confirm` withdraws it)."""
        if self.hang_timeout is None or self._reported:
            return None
        verdict = self._unstarted(state) or find_hang(self.views(state), self.hang_timeout)
        self._reported = verdict is not None
        return verdict

    def _unstarted(self, state: RunState) -> Verdict | None:
        """A rank with no heartbeat yet, past the start timeout (see :func:`find_unstarted`)."""
        if self.start_timeout is None:
            return None
        silent = [
            (r.rank, r.host)
            for r in state.ranks
            if r.rank not in self._ranks and not r.status.terminal
        ]
        return find_unstarted(silent, self.clock() - self._began, self.start_timeout)

    def confirm(self, state: RunState, verdict: Verdict) -> bool:
        """Whether ``verdict`` still holds on what arrived since (the same culprit);
        if not it is withdrawn and later checks may find another."""
        again = self._unstarted(state) or find_hang(self.views(state), self.hang_timeout or 0.0)
        held = again is not None and (again.rank, again.reason) == (verdict.rank, verdict.reason)
        self._reported = held
        return held


@dataclass
class HangProbe:
    """A verdict waiting for the stack dumps of ``hosts`` (until ``deadline``)."""

    verdict: Verdict
    hosts: set[str]
    deadline: float  # monotonic: the latest the verdict waits for dumps
    detected_at: float  # wall clock: the root cause's time
    confirm_at: float = 0.0  # monotonic: the earliest it may be judged again
    dumps: dict[int, StackDump] = field(default_factory=dict)

    def take(self, ev: StackDump | StacksDumped) -> None:
        if isinstance(ev, StackDump):
            self.dumps[ev.rank] = ev
        else:
            self.hosts.discard(ev.host)

    def done(self, now: float) -> bool:
        """Every host answered and a heartbeat interval passed (so the verdict is
        judged again on newer beats), or the wait is over."""
        return (not self.hosts and now >= self.confirm_at) or now >= self.deadline

    def result(self) -> RankExited:
        """The culprit's exit with a ``Hang`` root cause naming where it is, dated when
        the hang was detected."""
        ts = self.detected_at
        return RankExited(self.verdict.host, self.verdict.rank, -1, self.cause(ts), ts)

    def cause(self, ts: float) -> Failure:
        v = self.verdict
        dump = self.dumps.get(v.rank)
        where = (dump.where if dump is not None else None) or v.where
        inner = (dump.inner if dump is not None else None) or v.inner
        message = hang_message(v, where, inner)
        trace = _main_thread(dump.lines) if dump is not None else ()
        return Failure(
            v.host, v.rank, "Hang", message, trace, ts, kind=Kind.HANG, evidence=Evidence.SEEN
        )


def hang_message(v: Verdict, where: str | None, inner: str | None) -> str:
    """One line: what is wrong and where the culprit is, e.g. ``stuck 41 s at
    train.py:88 in step (in threading.py:320 in wait); never entered all_reduce #57,
    which rank 0 has waited in for 41 s``."""
    at = f" at {where}" if where else ""
    inside = f" (in {inner})" if inner and inner != where else ""
    if v.reason == "frozen":
        seen = f"; last seen{at}{inside}" if where or inner else ""
        return f"not responding: {v.detail}{seen}"
    if v.reason in ("stuck", "idle"):
        return f"stuck {v.seconds:.0f} s{at}{inside}; {v.detail}"
    if v.reason == "collective":
        return f"stuck {v.detail}{at}"
    return f"{v.detail}{at}{inside}"


def _main_thread(lines: tuple[str, ...]) -> tuple[str, ...]:
    """The main thread's part of a faulthandler (or ``py-spy dump``) dump, without the
    frames of dmlctl's rank entry below the script (all of it if not found)."""
    ident = next(
        (ln.rsplit("main thread ", 1)[1].strip() for ln in lines if "main thread 0x" in ln), None
    )
    out: list[str] = []
    inside = False
    for ln in lines:
        if ln.startswith(("Thread ", "Current thread 0x")):
            inside = (ident is not None and ident in ln) or '"MainThread"' in ln
            if inside:
                out.append(ln)
        elif inside and any(mark in ln for mark in _WRAPPER_FRAMES):
            inside = False  # dmlctl's rank entry and runpy below the script: not shown
        elif inside and ln.strip():
            out.append(ln)
    return tuple(out) if out else tuple(lines)


_WRAPPER_FRAMES = ("dmlctl/runtime/entry.py", "<frozen runpy>", "/runpy.py")
