"""One attempt of a run: a host agent started per host of the attempt's plan, their
output turned into events and folded into the run state until every agent has exited.

While it runs (all bounded):

* stops follow :mod:`dmlctl.launch.stops` (a user's stop, a failure's stop, agents
  killed once past their grace);
* a hang (:mod:`dmlctl.hangs.rules`) first has every agent dump every rank's stacks
  (``stacks/`` in the run directory; at most ``dump_wait`` seconds), then becomes the
  root cause, naming the culprit's frame, and the attempt is stopped as after a failure;
* an agent whose output ends without an ``exit`` message is reported as lost, and so
  is an agent silent for ``host_timeout`` seconds (agents send a keepalive every
  second; a host cut off from the network may keep its connection open for minutes).
  Lost hosts are kept for the next attempt's placement (:meth:`AttemptRunner.take_lost`).

Whether the run goes on afterwards is not decided here (see
:mod:`dmlctl.launch.supervisor` and :mod:`dmlctl.launch.policy`).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Mapping

from dmlctl.failure import Evidence, Failure, Kind
from dmlctl.hangs.watch import CONFIRM_S, HangProbe, Liveness
from dmlctl.launch.attempt_store import AttemptStore
from dmlctl.launch.books import RunBooks
from dmlctl.launch.host_swap import HostSwap
from dmlctl.launch.notes import AttemptNotes
from dmlctl.launch.policy import NO_CHECKPOINT, Failed, Succeeded, over_budget
from dmlctl.launch.standby import Standbys
from dmlctl.launch.stops import AttemptStops, StopRules
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.provision.replicate import Replicator
from dmlctl.runs.events import (
    AgentExited,
    AgentStarted,
    CheckpointSaved,
    Event,
    HostReplaced,
    ProcSample,
    Progress,
    RankStarted,
    StopRequested,
)
from dmlctl.runs.parser import parse_line
from dmlctl.runs.state import RunState
from dmlctl.transport.base import Process, Transport

BATCH = 8  # agent messages handled per step (each carries up to ~256 KiB of lines)
QUEUE_MAX = 16  # agent messages read ahead of the supervisor: bounds the controller's memory
STALL_S = 2.0  # a turn of the loop longer than this means the controller itself stood still


@dataclasses.dataclass
class Attempt:
    """The bookkeeping of one attempt under way (its plan, hosts, stop deadlines)."""

    plan: LaunchPlan
    number: int  # 0-based
    live: set[str] = dataclasses.field(default_factory=set)
    exited: set[str] = dataclasses.field(default_factory=set)
    stops: AttemptStops = dataclasses.field(default_factory=AttemptStops)
    last_persist: float = 0.0


@dataclasses.dataclass(frozen=True)
class AttemptResult:
    """How an attempt ended, typed once: its last state and its outcome — every rank
    done (``Succeeded``), the run's root cause (``Failed``), or a stop asked while it
    ran (``StopRequested``, whatever else happened meanwhile)."""

    state: RunState
    outcome: Succeeded | Failed | StopRequested


@dataclasses.dataclass(frozen=True)
class AttemptSettings:
    """How an attempt is run: the ranks' grace on a stop (sent to the agents), the
    longest wait for stack dumps, how often the state is persisted, the silence after
    which a host counts as lost (None: never)."""

    stop_grace: float
    dump_wait: float
    persist_interval: float
    host_timeout: float | None


class AttemptRunner:
    """Runs attempts, one at a time: :meth:`start` then :meth:`follow`."""

    def __init__(
        self,
        transports: Mapping[str, Transport],
        books: RunBooks,
        notes: AttemptNotes,
        stops: StopRules,
        settings: AttemptSettings,
        *,
        clock: Callable[[], float] = time.time,
        standbys: Standbys | None = None,
        replicator: Replicator | None = None,
    ) -> None:
        self.transports = transports
        self.books = books
        self.notes = notes
        self.stops = stops
        self.settings = settings
        self.clock = clock
        self.standbys = standbys  # warm agents (torchrun imported) for a restart
        self.replicator = replicator
        self.liveness = Liveness(settings.host_timeout)
        self._lost_hosts: dict[str, str] = {}  # host → why, in the current attempt
        self._running_since: dict[str, float] = {}  # host → first rank start (monotonic)
        # Bounded: a reader blocks when the supervisor is behind, the agent then blocks
        # on its pipe and the ranks' files hold the rest (nothing is dropped).
        self._queue: queue.Queue[tuple[str, str | None]] = queue.Queue(QUEUE_MAX)
        self._procs: dict[str, Process] = {}
        self._swap: HostSwap | None = None
        self._store = AttemptStore(settings.host_timeout, self._store_refused)  # plan.store_host

    def _store_refused(self, why: str) -> None:
        """The run's store closed a connection unserved (said in the run's log)."""
        self.books.post(Progress(f"the run's store closed {why}", self.clock()))

    @property
    def lost_now(self) -> frozenset[str]:
        """The hosts lost in the current attempt so far (see :meth:`take_lost`)."""
        return frozenset(self._lost_hosts)

    @property
    def swapped_in(self) -> dict[str, HostPlan]:
        """The hosts that took a lost host's ranks in the current attempt, as they
        run there."""
        return dict(self._swap.placed) if self._swap is not None else {}

    def take_lost(self) -> dict[str, str]:
        """The hosts lost in the attempt (host → why); forgotten once taken."""
        lost, self._lost_hosts = self._lost_hosts, {}
        return lost

    def start(self, state: RunState, plan: LaunchPlan, number: int) -> tuple[RunState, Attempt]:
        """Start an agent on every host of ``plan`` as attempt ``number`` (0-based);
        a host whose agent cannot be started is lost at once."""
        self._procs, self._lost_hosts, self._running_since = {}, {}, {}
        said = self._store.open(plan)
        first: list[Event] = [] if said is None else [Progress(said, self.clock())]
        self._swap = HostSwap(plan, outside=self._store.endpoint)
        self.notes.reset()  # the stderr tails of this attempt only
        hosts = ", ".join(h.name for h in plan.hosts)
        what = "starting" if number == 0 else f"restarting (attempt {number + 1})"
        first.append(Progress(f"{what} host agents on {hosts}", self.clock()))
        if number > 0 and plan.checkpoint is None:
            first.append(Progress(f"{NO_CHECKPOINT}: the steps done are lost", self.clock()))
        first += self._start_agents(plan, number)
        run = Attempt(plan, number, live=set(self._procs))
        run.exited = {e.host for e in first if isinstance(e, AgentExited)}
        state = self.books.fold(state, first)
        self.liveness.reset(run.live)
        return state, run

    def follow(self, state: RunState, run: Attempt) -> AttemptResult:
        """Follow the started attempt until every agent has exited; how it ended. The
        attempt's store, when the controller holds it, closes then."""
        try:
            return self._follow(state, run)
        finally:
            self._store.close()

    def _follow(self, state: RunState, run: Attempt) -> AttemptResult:
        turn = time.monotonic()
        while run.live:
            batch = self.books.take_posted() + self._read_events(run) + self.books.writer.check()
            now = self.clock()
            turn, stood = time.monotonic(), time.monotonic() - turn
            if stood > STALL_S:  # this loop was blocked (a full terminal, a slow disk):
                self.liveness.shift(stood)  # nothing could arrive meanwhile, so that
                self.notes.hangs.shift(stood)  # time is nobody's silence
            batch += self._silent_hosts(run)
            batch += self.stops.apply(run.stops, self._procs, run.live, state, batch, now)
            self.books.sink.tick()
            before = state.phase
            state = self.books.fold(state, batch)
            if run.stops.stop_sent is None:  # judged on the state with every event so far
                found = self._watch_hangs(state, run) + over_budget(state, run.plan.restart)
                state = self.books.fold(state, found)
                batch += found
                if state.root_cause is None:
                    self._warm_up(run)
            changed = state.phase != before
            if changed or (batch and now - run.last_persist >= self.settings.persist_interval):
                state = self.books.persist(state)
                run.last_persist = now
        return AttemptResult(state, self._outcome(state))

    def _outcome(self, state: RunState) -> Succeeded | Failed | StopRequested:
        """The ended attempt's outcome (a stop asked for first, then a root cause)."""
        if self.stops.reason is not None:
            return StopRequested(self.stops.reason, self.clock())
        if state.root_cause is not None:
            return Failed(state.root_cause)
        return Succeeded()

    def _silent_hosts(self, run: Attempt) -> list[Event]:
        """The exits of the agents silent for longer than ``host_timeout`` (killed).
        An agent on this machine whose process still runs is never lost: its silence
        is the machine's load (it is judged by its exit, and its ranks by the hang
        detector)."""
        out: list[Event] = []
        for host in self.liveness.silent(run.live - run.exited):
            if self._procs[host].alive_here():
                continue
            run.exited.add(host)
            timeout = self.settings.host_timeout or 0.0
            why = f"no message from the host for {timeout:.0f} s (unreachable?)"
            self._procs[host].kill()
            out += self._gone(run, host, why, killed=False)
        return out

    def _gone(self, run: Attempt, host: str, why: str | None, killed: bool) -> list[Event]:
        """``host``'s agent is lost (its output ended without an ``exit`` message, or
        it was silent for ``why``): its ranks started on another host while the others
        go on (:mod:`dmlctl.launch.host_swap`) when they can be, else its exit as a
        lost host (the run restarts), with why they could not be when the run
        replaces lost ranks in place. ``killed``: by the stop rules (no host failure)."""
        lost = self._lost(host, why, killed=killed)
        swap = self._swap
        if lost.cause is None or run.stops.stop_sent is not None or swap is None:
            return [lost]
        reason = swap.why_not(host, ended=why is None)
        if reason is None:
            for target in swap.targets(host, ended=why is None):
                if replaced := self._replace(run, host, target, lost):
                    return replaced
            reason = "no spare host could start an agent"
            if dropped := swap.go_on_without(host, lost.cause, self.clock(), why is None):
                return dropped
        if reason == swap.RESTART_FULL:
            return [lost]
        said = f"the ranks of {host} cannot go on elsewhere while the others train: {reason}"
        return [Progress(said, self.clock()), lost]

    def _replace(self, run: Attempt, host: str, target: HostPlan, lost: AgentExited) -> list[Event]:
        """Start ``target``'s agent with lost ``host``'s ranks; the events saying so
        (none when the agent cannot be started)."""
        assert self._swap is not None and lost.cause is not None
        try:
            warm = self.standbys.take(target.name) if self.standbys is not None else None
            proc = warm or self.transports[target.name].start(
                target.agent_argv, cwd=target.agent_cwd
            )
        except Exception:
            return []
        config = self._swap.config(host, target, run.number, self.settings.stop_grace)
        proc.send(config.to_json())
        self._procs[target.name] = proc
        run.live.add(target.name)
        run.exited.discard(target.name)
        self.liveness.heard(target.name)
        threading.Thread(target=self._read, args=(target.name, proc), daemon=True).start()
        if target.name == host:  # back: not set aside for a later attempt
            self._lost_hosts.pop(host, None)
        ranks = self._swap.moved(host, target.name)
        now = self.clock()
        names = ", ".join(map(str, ranks))
        which = f"rank {names} starts" if len(ranks) == 1 else f"ranks {names} start"
        text = f"{host} lost ({lost.cause.message}); {which} again on {target.name}"
        text += " while the others go on"
        return [HostReplaced(host, target.name, ranks, lost.cause, now), Progress(text, now)]

    def _read(self, host: str, proc: Process) -> None:
        try:
            for line in proc.lines():
                self._queue.put((host, line))
        finally:
            self._queue.put((host, None))

    def _start_agents(self, plan: LaunchPlan, number: int) -> list[Event]:
        events: list[Event] = []
        for host in plan.hosts:
            try:
                warm = self.standbys.take(host.name) if self.standbys is not None else None
                proc = warm or self.transports[host.name].start(host.agent_argv, cwd=host.agent_cwd)
            except Exception as e:
                cause = Failure(
                    host.name,
                    None,
                    type(e).__name__,
                    f"cannot start agent: {e}",
                    (),
                    self.clock(),
                    kind=Kind.AGENT,
                    evidence=Evidence.SEEN,
                )
                events.append(AgentExited(host.name, 127, (), self.clock(), cause))
                self._lost_hosts[host.name] = f"cannot start agent: {e}"
                continue
            store = self._store.endpoint
            proc.send(plan.agent_config(host, number, self.settings.stop_grace, store).to_json())
            self._procs[host.name] = proc
            threading.Thread(target=self._read, args=(host.name, proc), daemon=True).start()
        return events

    def _warm_up(self, run: Attempt) -> None:
        """Standby agents where they are due, the spare's too (:meth:`_replace`)."""
        if self.standbys is not None:
            spare = self._swap.next_spare() if self._swap is not None else None
            running = [h for h in run.plan.hosts if h.name in run.live - run.exited]
            self.standbys.warm_up_all(running, self._running_since, spare)

    def _lost(self, host: str, why: str | None = None, killed: bool = False) -> AgentExited:
        """The exit of ``host``'s agent, whose output ended without an ``exit`` message:
        a lost host, set aside for the next attempt — unless the stop rules killed it
        (``killed``): then it is a stop that took too long, not a host failure."""
        proc = self._procs[host]
        code = proc.wait(0.5 if why else 5.0)
        tail = tuple(proc.stderr_tail())
        if killed:
            return AgentExited(host, code if code is not None else -1, tail, self.clock())
        msg = why or f"host agent ended without reporting (exit code {code})"
        self._lost_hosts[host] = msg
        now = self.clock()
        cause = Failure(
            host, None, "AgentLost", msg, tail, now, kind=Kind.AGENT_LOST, evidence=Evidence.SEEN
        )
        return AgentExited(host, code if code is not None else -1, tail, now, cause)

    def _read_events(self, run: Attempt) -> list[Event]:
        """The events of the agent messages waiting now (at most 0.1 s for the first)."""
        batch: list[Event] = []
        items = self._drain()
        now = self.clock()
        for host, line in items:
            if line is None:
                run.live.discard(host)
                if host not in run.exited:
                    batch += self._gone(run, host, None, killed=host in run.stops.killed)
                continue
            self.liveness.heard(host)
            for ev in parse_line(host, line, now):
                batch.append(ev)
                if not isinstance(ev, ProcSample):  # more than a keepalive: still streaming
                    run.stops.data_at[host] = now
                batch += self._on_event(run, ev, now)
        return batch

    def _on_event(self, run: Attempt, ev: Event, now: float) -> list[Event]:
        """Note what an agent's event means for the attempt; the events it adds."""
        if isinstance(ev, AgentExited):
            run.exited.add(ev.host)
        elif isinstance(ev, CheckpointSaved) and self.replicator is not None:
            self.replicator.saved(ev.host, ev.step)
        elif isinstance(ev, RankStarted):
            self._running_since.setdefault(ev.host, time.monotonic())
            if self._swap is not None:
                self._swap.started(ev.host, ev.rank, ev.local_rank, ev.store)
        elif isinstance(ev, AgentStarted):
            text = (
                f"torchrun started on {ev.host}; waiting for rendezvous "
                f"({run.plan.world_size} workers)"
                if ev.host not in self.swapped_in
                else f"stand-in started on {ev.host}; its ranks join the running world"
            )
            return [Progress(text, now)]
        return []

    def _watch_hangs(self, state: RunState, run: Attempt) -> list[Event]:
        """A hang verdict asks every agent for stack dumps; once they are in and it still
        holds on newer beats (or ``dump_wait`` passed) it becomes the culprit's ``Hang``
        exit. A verdict that no longer holds is withdrawn (the stacks stay on disk)."""
        now = time.monotonic()
        notes = self.notes
        if notes.probe is None:
            verdict = notes.hangs.check(state)
            if verdict is None:
                return []
            asked = {h for h in run.live - run.exited if self._procs[h].send("dump")}
            wait = self.settings.dump_wait
            notes.probe = HangProbe(
                verdict, asked, now + wait, self.clock(), confirm_at=now + min(CONFIRM_S, wait)
            )
            note = f"rank {verdict.rank} on {verdict.host} seems hung ({verdict.reason})"
            return [Progress(f"{note}; taking every rank's stacks", self.clock())]
        if not notes.probe.done(now):
            return []
        probe, notes.probe = notes.probe, None
        if not notes.hangs.confirm(state, probe.verdict):
            text = f"rank {probe.verdict.rank} on {probe.verdict.host} is not hung after all"
            return [Progress(text, self.clock())]
        return [probe.result()]

    def _drain(self) -> list[tuple[str, str | None]]:
        """Up to BATCH queued messages, waiting at most 0.1 s for the first."""
        items: list[tuple[str, str | None]] = []
        try:
            items.append(self._queue.get(timeout=0.1))
            while len(items) < BATCH:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return items
