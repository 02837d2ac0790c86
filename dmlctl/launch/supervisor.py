"""The supervisor: runs a plan's attempts (:mod:`dmlctl.launch.attempt`) and acts on
the restart policy (:mod:`dmlctl.launch.policy`) between them, as torch's elastic agent
acts on its workers' states; it records and renders the run and tears it down.

What it observes becomes the policy's signals, on the monotonic clock:

* the attempt's agents were started → ``Started``;
* the attempt ended with a root cause (or none could be started: a full disk, too few
  hosts) → ``Failed(cause)``, without one → ``Succeeded``;
* a stop was asked for (Ctrl-C, ``dmlctl stop``) → ``StopRequested``;
* time passing while it waits before a restart → ``Tick``.

and it carries out the actions: ``RESTART_NOW`` starts the next attempt, ``GIVE_UP``
ends the run with its root cause, ``STOP`` ends it stopped. A failure the policy
restarts is announced with a ``Restarting`` event (the policy's backoff as its delay);
the wait is RESTARTING plus ticks, and a stop during it ends the run without a restart.

Between attempts: lost hosts are set aside and the next attempt is placed on the hosts
that answer (:class:`dmlctl.launch.hosts.HostPool`, :func:`dmlctl.plan.elastic.place`),
at a new rendezvous port when another process took the last one; the controller's
copy of the newest checkpoint is handed to them
(:class:`dmlctl.provision.replicate.Replicator`), which also copies every checkpoint a
rank reports while the run goes on.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from dmlctl.errors import DmlctlError
from dmlctl.failure import CONTROLLER, PORT_TAKEN, Evidence, Failure, Kind
from dmlctl.hangs.watch import DUMP_WAIT_S
from dmlctl.launch.attempt import AttemptRunner, AttemptSettings
from dmlctl.launch.books import RunBooks
from dmlctl.launch.hosts import HostPool, HostsLost, resized
from dmlctl.launch.notes import AttemptNotes
from dmlctl.launch.policy import (
    CONTROLLER_LOST,
    Action,
    Failed,
    RestartState,
    Signal,
    Started,
    Tick,
    backoff,
    respawned,
    resumed,
    step,
)
from dmlctl.launch.requeue import Reallocation, allocation_end
from dmlctl.launch.standby import WARM_AFTER, Standbys
from dmlctl.launch.stops import STOP_MARGIN, StopRules
from dmlctl.plan.elastic import CannotReplan, meeting_at, place, replan
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.provision.replicate import Replicator
from dmlctl.redact import Redactor
from dmlctl.runs.events import (
    AgentExited,
    Event,
    Finished,
    Progress,
    Restarting,
    StopRequested,
)
from dmlctl.runs.sink import Sink
from dmlctl.runs.state import Phase, RunState, new_run_state
from dmlctl.runs.store import RunDir
from dmlctl.runs.writer import RunWriter
from dmlctl.spec.restart import RestartSpec
from dmlctl.transport.base import Transport

FINAL_COPY_WAIT = 30.0  # seconds the end of a run waits for a checkpoint copy under way
TICK_S = 0.1  # the longest sleep between two ticks of a wait before a restart
NO_RESTARTS = RestartSpec(max_infra_restarts=0)
"""The supervisor's policy when it is given none: every failure ends the run."""


class Supervisor:
    """Runs one plan to its end (see the module docstring). ``restart`` gives the
    policy's budgets and backoff; the other settings of a ``restart:`` block are
    passed on their own (``hang_timeout`` and ``host_timeout`` None: never judged)."""

    def __init__(
        self,
        plan: LaunchPlan,
        run: RunDir,
        transports: Mapping[str, Transport],
        sink: Sink,
        *,
        restart: RestartSpec = NO_RESTARTS,
        clock: Callable[[], float] = time.time,
        fail_grace: float = 2.0,
        stop_grace: float = 30.0,
        stop_margin: float = STOP_MARGIN,
        dump_wait: float = DUMP_WAIT_S,
        persist_interval: float = 0.5,
        hang_timeout: float | None = None,
        host_timeout: float | None = None,
        hosts: HostPool | None = None,
        rendezvous: Callable[[HostPlan], str] | None = None,
        replicator: Replicator | None = None,
        standby: bool = False,
        warm_after: float = WARM_AFTER,
        redactor: Redactor | None = None,
        reallocation: Reallocation | None = None,
    ) -> None:
        self.plan = plan  # the current attempt's plan
        self.reallocation = reallocation  # the Slurm allocation the hosts are in
        self._requeue = False  # the last attempt's allocation ended early: ask again
        self.base_plan = plan
        #: Every host an attempt ran on (where rank files are to be collected from).
        self.hosts_used: dict[str, HostPlan] = {h.name: h for h in plan.hosts}
        self.restart = restart
        self.sink = sink
        self.clock = clock
        self.stops = StopRules(
            stop_grace=stop_grace, fail_grace=fail_grace, stop_margin=stop_margin
        )
        notes = AttemptNotes(hang_timeout, restart.start_timeout, plan.world_size)
        self.books = RunBooks(run, sink, clock=clock, redactor=redactor, notes=notes)
        self.hosts = hosts
        #: A rendezvous endpoint on a host (for an attempt whose first host is not the
        #: planned one, or whose port was taken); default: the planned port there.
        self.rendezvous = rendezvous or (
            lambda h: f"{h.address}:{plan.rdzv_endpoint.rsplit(':', 1)[1]}"
        )
        self.replicator = replicator
        #: Warm agents (torchrun imported) ready on every host for a restart, or None.
        self.standbys = Standbys(transports, warm_after) if standby else None
        settings = AttemptSettings(stop_grace, dump_wait, persist_interval, host_timeout)
        self.attempts = AttemptRunner(
            transports,
            self.books,
            notes,
            self.stops,
            settings,
            clock=clock,
            standbys=self.standbys,
            replicator=replicator,
        )
        #: Why the final state could not be written (the run directory is gone …).
        self.unrecorded: str | None = None

    @property
    def writer(self) -> RunWriter:
        """The run's writes to its directory (and whether the store failed)."""
        return self.books.writer

    def request_stop(self, reason: str) -> None:
        """Ask the run to stop (thread- and signal-safe). A second request forces."""
        self.stops.request(reason)

    def post(self, event: Event) -> None:
        """Hand an event over from another thread (the checkpoint copier)."""
        self.books.post(event)

    def run(self, resume_from: RunState | None = None) -> RunState:
        """Run the plan to its end, restarting it as the policy says; returns the final
        state (also persisted). ``resume_from`` is the last state of the same run whose
        controller died (or that failed for a full disk: its root cause becomes one of
        its failures): the run goes on as its next attempt (ranks resume from their
        checkpoints), keeping its restart count, its failures and the restart budgets
        they spent."""
        state, policy = self._begin(resume_from)
        signal = self._blocked(state)
        while True:
            if signal is None:  # nothing stands in the way: run the attempt
                state, attempt = self.attempts.start(state, self.plan, policy.attempt)
                policy, _ = self._feed(policy, Started())
                ended = self.attempts.follow(state, attempt)
                self.hosts_used.update(self.attempts.swapped_in)
                policy = respawned(policy, ended.state.respawns - state.respawns)
                state, signal = self._judged(ended.state, ended.outcome)
            policy, action = self._feed(policy, signal)
            if policy.phase is Phase.RESTARTING:  # a restart granted: announce, wait for it
                state = self._restarting(state, policy)
                state, policy, action = self._wait(state, policy)
            if action is not Action.RESTART_NOW:
                break  # GIVE_UP (its root cause stands), STOP, or NONE: the run succeeded
            state = self._between_attempts(state)
            signal = self._blocked(state)
        return self._finish(state)

    def _judged(self, state: RunState, outcome: Signal) -> tuple[RunState, Signal]:
        """A failed attempt whose allocation ended (Slurm's time limit, a preemption, a
        cancel) failed for that: its root cause; a restart on a new allocation when
        ``slurm.requeue`` answers that end, else none."""
        realloc = self.reallocation
        if not isinstance(outcome, Failed) or realloc is None:
            return state, outcome
        end = realloc.ended(self._stopping)
        if end is None:  # its time limit near (slurm.warn_before_end): that said it all
            self._requeue = realloc.warned_now() and realloc.where.requeue
            return state, outcome
        slurm_state, why = end
        self._requeue = realloc.may_requeue(slurm_state)
        if self._requeue:
            why += "; slurm.requeue asks for a new one while restart.max_infra_restarts allows"
        state = self._ended(state, Kind.REQUEUED if self._requeue else Kind.ALLOCATION, why)
        assert state.root_cause is not None  # the allocation's end explains every death
        return state, Failed(state.root_cause)

    def _ended(self, state: RunState, kind: Kind, why: str) -> RunState:
        """``state`` with the end of the run's allocation as a failure of ``kind``."""
        return self.books.fold(state, [allocation_end(kind, why, self.clock())])

    def _requeued(self, state: RunState) -> RunState:
        """The run on its new allocation (slurm.requeue): the same request granted
        again, every host on its new node and none set aside, no standby agent of the
        old nodes kept; a request Slurm refuses ends the run with that as its root cause."""
        self._requeue = False
        assert self.reallocation is not None
        if self.standbys is not None:  # warm on the old nodes, which are going away
            self.standbys.drop()

        def note(text: str) -> None:
            self.books.fold(state, [Progress(text, self.clock())])  # shown, not kept
            self.sink.tick()

        try:
            base = self.reallocation.again(self.base_plan, note, self._stopping)
        except (DmlctlError, OSError) as e:
            if self._stopping():  # a stop while the new allocation queued: a stop
                stop = StopRequested(self.stops.reason or "", self.clock())
                return self.books.fold(state, [stop])
            return self._ended(state, Kind.ALLOCATION, f"slurm.requeue: {e}")
        try:
            endpoint = self.rendezvous(base.hosts[0])  # a port free on the new first node
        except DmlctlError as e:
            why = f"slurm.requeue: the new allocation's {base.hosts[0].name} cannot serve: {e}"
            return self._ended(state, Kind.ALLOCATION, why)
        self.base_plan = self.plan = replan(base, [h.name for h in base.hosts], endpoint)
        if self.hosts is not None:
            self.hosts.renew(self.base_plan)
        return state

    def _begin(self, resume_from: RunState | None) -> tuple[RunState, RestartState]:
        """The run's first state and the policy's, before its first attempt (for a
        resumed run: announced as a restart, budgets seeded, the attempt placed)."""
        plan = self.plan
        if resume_from is None:
            ranks = [(r.rank, r.host, r.role) for r in plan.ranks]
            state = new_run_state(
                plan.run_id, plan.job_name, plan.strategy, ranks, self.clock(), plan.mesh
            )
            return self.books.fold(state, self.writer.start()), RestartState()
        attempt = resume_from.restarts + 1
        policy = resumed(resume_from.failures, attempt)
        lost = resume_from.root_cause or Failure(
            CONTROLLER,
            None,
            CONTROLLER_LOST,
            "the controller died; resumed with dmlctl launch --resume",
            (),
            self.clock(),
            kind=Kind.CONTROLLER,
            evidence=Evidence.SEEN,
        )
        state = dataclasses.replace(
            resume_from, phase=Phase.RUNNING, ended_at=None, exit_code=None, stop_reason=None
        )
        state = self.books.fold(state, [Restarting(attempt, lost, 0.0, self.clock())])
        state = self.books.fold(state, self.writer.start())  # a full disk stops here
        if state.root_cause is None:
            state = self._between_attempts(state)
        return state, policy

    def _feed(self, policy: RestartState, signal: Signal) -> tuple[RestartState, Action]:
        """One step of the restart policy, now (monotonic clock)."""
        return step(policy, signal, time.monotonic(), self.restart)

    def _stopping(self) -> bool:
        return self.stops.reason is not None

    def _blocked(self, state: RunState) -> Signal | None:
        """What keeps the next attempt from starting (a stop, or a failure before it:
        a full disk, too few hosts), as the policy's signal; None if nothing does."""
        if state.phase is Phase.STOPPING:
            return StopRequested(state.stop_reason or "", self.clock())
        if state.root_cause is not None:
            return Failed(state.root_cause)
        return None

    def _restarting(self, state: RunState, policy: RestartState) -> RunState:
        """Announce the restart the policy granted (and persist the state)."""
        assert policy.last_cause is not None  # RESTARTING always has its cause
        delay = backoff(self.restart, policy.attempt)
        event = Restarting(policy.attempt + 1, policy.last_cause, delay, self.clock())
        return self.books.persist(self.books.fold(state, [event]))

    def _wait(self, state: RunState, policy: RestartState) -> tuple[RunState, RestartState, Action]:
        """Tick the policy until its restart is due (``RESTART_NOW``) or a stop was
        asked for (``STOP``, folded into the state); the dashboard keeps ticking."""
        while True:
            if self._stopping():
                stop = StopRequested(self.stops.reason or "", self.clock())
                policy, action = self._feed(policy, stop)
                return self.books.fold(state, [stop]), policy, action
            policy, action = self._feed(policy, Tick())
            if action is Action.RESTART_NOW:
                return state, policy, action
            self.sink.tick()
            left = (policy.next_start_at or 0.0) - time.monotonic()
            time.sleep(min(TICK_S, max(0.0, left)))

    def _between_attempts(self, state: RunState) -> RunState:
        """Place the next attempt on the hosts that answer and hand them the newest
        checkpoint. A run that cannot go on gets its root cause here (``HostsLost``),
        a stop while waiting for hosts its ``StopRequested``."""
        lost = self.attempts.take_lost()
        if self._requeue:  # new machines: none of the old ones' losses count
            lost = {}
            state = self._requeued(state)
            if state.root_cause is not None or self._stopping():
                return state
        if state.failures and state.failures[-1].exc_type == PORT_TAKEN:
            state = self._meet_elsewhere(state)
        if self.hosts is None:
            return state
        try:
            plan = self._place(state, lost)
        except (HostsLost, CannotReplan) as e:
            if self.reallocation is not None and (end := self.reallocation.ended()):
                return self._ended(state, Kind.ALLOCATION, end[1])  # Slurm ended it meanwhile
            host = next(iter(lost), self.plan.hosts[0].name)
            return self._host_failed(state, host, "HostsLost", str(e), Kind.HOSTS_LOST)
        if plan is None:
            stop = StopRequested(self.stops.reason or "", self.clock())
            return self.books.fold(state, [stop])
        if [h.name for h in plan.hosts] != [h.name for h in self.plan.hosts]:
            state = self.books.fold(state, [resized(self.plan, plan, self.clock())])
        self.plan = plan
        self.hosts_used.update({h.name: h for h in plan.hosts})
        if self.replicator is not None:
            self.replicator.track(plan.hosts)
            for problem in self.replicator.hand_out(plan.hosts):
                state = self.books.fold(state, [Progress(problem, self.clock())])
        return state

    def _meet_elsewhere(self, state: RunState) -> RunState:
        """The run's plans meeting at a new rendezvous port on their first host (the
        last attempt's was taken by another process); a host that cannot give one
        ends the run with that as its root cause."""
        first = self.plan.hosts[0]
        try:
            endpoint = self.rendezvous(first)
        except DmlctlError as e:
            return self._host_failed(state, first.name, PORT_TAKEN, str(e), Kind.AGENT)
        if self.base_plan.hosts[0].name == first.name:
            self.base_plan = meeting_at(self.base_plan, endpoint)
        self.plan = meeting_at(self.plan, endpoint)
        return state

    def _host_failed(self, state: RunState, host: str, name: str, why: str, kind: Kind) -> RunState:
        """``state`` with the run's root cause: ``host`` cannot take the next attempt."""
        cause = Failure(host, None, name, why, (), self.clock(), kind=kind, evidence=Evidence.SEEN)
        return self.books.fold(state, [AgentExited(host, 255, (), self.clock(), cause)])

    def _place(self, state: RunState, lost: dict[str, str]) -> LaunchPlan | None:
        """The next attempt's plan on the hosts that answer (lost hosts set aside; the
        wait for them is shown as progress), or None if a stop came meanwhile. Raises
        ``HostsLost`` or ``CannotReplan`` when the run cannot go on."""
        assert self.hosts is not None
        for host, why in lost.items():
            self.hosts.lose(host, why)
        notes: list[str] = []

        def note(text: str) -> None:
            if not notes or notes[-1] != text:
                notes.append(text)
                self.books.fold(state, [Progress(text, self.clock())])  # shown, not kept
            self.sink.tick()

        avail = self.hosts.next_hosts(lost, stopping=self._stopping, note=note)
        if avail is None:
            return None
        return place(self.base_plan, self.plan, avail, self.rendezvous)

    def _finish(self, state: RunState) -> RunState:
        """Close what outlives attempts, fold in the run's end and write it."""
        if self.standbys is not None:
            self.standbys.close()
        if self.replicator is not None:
            self.replicator.drain(FINAL_COPY_WAIT)  # the last checkpoint, if still copying
            self.replicator.close()
        # A run directory deleted since the last check is the run's cause, not what
        # the ranks met because of it (their checkpoints inside it): seen before the end.
        state = self.books.fold(state, self.writer.check(now=True))
        state = self.books.fold(state, [*self.books.take_posted(), Finished(self.clock())])
        self.unrecorded = self.writer.finish(state)
        self.sink.close(state)
        return state
