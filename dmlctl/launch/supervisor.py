"""The supervisor: starts one host agent per host, turns their output into events,
reduces them into the run state, records and renders it, and tears the run down.

Stop rules (all bounded):

* a user's stop and a failure stop the agents as :mod:`dmlctl.launch.stops` says (the
  ranks get SIGTERM and a grace, the agents are killed if they outlive it); a stopped
  run ends ``stopped`` whatever the ranks' exit codes;
* a hang (:mod:`dmlctl.launch.hangs`) first has every agent dump every rank's stacks
  (``stacks/`` in the run directory; at most ``dump_wait`` seconds), then becomes the
  root cause, naming the culprit's frame, and the run is stopped as after a failure;
* an agent whose output ends without an ``exit`` message is reported as lost, and so
  is an agent silent for ``host_timeout`` seconds (agents send a keepalive every
  second; a host cut off from the network may keep its connection open for minutes).

Between attempts (``decide`` said to restart): lost hosts are set aside and the next
attempt is placed on the hosts that answer (:class:`dmlctl.launch.hosts.HostPool`,
:func:`dmlctl.plan.elastic.replan`); the controller's copy of the newest checkpoint
is handed to them (:class:`dmlctl.provision.replicate.Replicator`), which also copies
every checkpoint a rank reports while the run goes on.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Mapping

from dmlctl.launch.hosts import HostPool, HostsLost
from dmlctl.launch.standby import WARM_AFTER, Standbys
from dmlctl.launch.stops import STOP_MARGIN, AttemptStops, StopRules
from dmlctl.launch.watch import CONFIRM_S, DUMP_WAIT_S, HangProbe, HangWatch, Liveness
from dmlctl.plan.elastic import CannotReplan, place
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.provision.replicate import Replicator
from dmlctl.redact import Redactor
from dmlctl.runs.events import (
    CONTROLLER,
    AgentExited,
    AgentStarted,
    CheckpointSaved,
    Event,
    Finished,
    Heartbeat,
    ProcSample,
    Progress,
    RankExited,
    RankStarted,
    Resized,
    Restarting,
    RootCause,
    StackDump,
    StacksDumped,
    StopRequested,
)
from dmlctl.runs.parser import parse_line
from dmlctl.runs.redaction import redact_events
from dmlctl.runs.sink import Sink
from dmlctl.runs.state import Phase, RunState, apply, new_run_state
from dmlctl.runs.stderr_tail import StderrTails
from dmlctl.runs.store import RunDir
from dmlctl.runs.writer import RunWriter
from dmlctl.transport.base import Process, Transport

BATCH = 8  # agent messages handled per step (each carries up to ~256 KiB of lines)
QUEUE_MAX = 16  # agent messages read ahead of the supervisor: bounds the controller's memory
FINAL_COPY_WAIT = 30.0  # seconds the end of a run waits for a checkpoint copy under way
STALL_S = 2.0  # a turn of the loop longer than this means the controller itself stood still


class Supervisor:
    def __init__(
        self,
        plan: LaunchPlan,
        run: RunDir,
        transports: Mapping[str, Transport],
        sink: Sink,
        *,
        clock: Callable[[], float] = time.time,
        fail_grace: float = 2.0,
        stop_grace: float = 30.0,
        stop_margin: float = STOP_MARGIN,
        dump_wait: float = DUMP_WAIT_S,
        persist_interval: float = 0.5,
        decide: Callable[[RunState], float | None] | None = None,
        hang_timeout: float | None = None,
        host_timeout: float | None = None,
        hosts: HostPool | None = None,
        rendezvous: Callable[[HostPlan], str] | None = None,
        replicator: Replicator | None = None,
        standby: bool = False,
        warm_after: float = WARM_AFTER,
        redactor: Redactor | None = None,
    ) -> None:
        self.plan = plan  # the current attempt's plan
        self.base_plan = plan
        #: Every host an attempt ran on (where rank files are to be collected from).
        self.hosts_used: dict[str, HostPlan] = {h.name: h for h in plan.hosts}
        self.run_dir = run
        self.transports = transports
        self.sink = sink
        self.clock = clock
        self.stop_grace = stop_grace
        self.stops = StopRules(
            stop_grace=stop_grace, fail_grace=fail_grace, stop_margin=stop_margin
        )
        self.dump_wait = dump_wait
        self.persist_interval = persist_interval
        #: Given a failed attempt's state: seconds to wait before a restart, or None.
        self.decide: Callable[[RunState], float | None] = decide or (lambda _state: None)
        self.host_timeout = host_timeout
        self.liveness = Liveness(host_timeout)
        self.hangs = HangWatch(hang_timeout)
        self._probe: HangProbe | None = None  # a hang verdict waiting for stack dumps
        self.hosts = hosts
        #: The rendezvous endpoint (``address:port``) of an attempt whose first host
        #: is not the planned one; by default the planned endpoint's port on its address.
        self.rendezvous = rendezvous or (
            lambda h: f"{h.address}:{plan.rdzv_endpoint.rsplit(':', 1)[1]}"
        )
        self.replicator = replicator
        self._inbox: queue.Queue[Event] = queue.Queue()  # events from other threads
        self._lost_hosts: dict[str, str] = {}  # host → why, in the current attempt
        #: Warm agents (torchrun imported) ready on every host for a restart, or None.
        self.standbys = Standbys(transports, warm_after) if standby else None
        self._running_since: dict[str, float] = {}  # host → first rank start (monotonic)
        # Bounded: a reader blocks when the supervisor is behind, the agent then blocks
        # on its pipe and the ranks' files hold the rest (nothing is dropped).
        self._queue: queue.Queue[tuple[str, str | None]] = queue.Queue(QUEUE_MAX)
        self._procs: dict[str, Process] = {}
        self._stderr = StderrTails()
        #: Hides the run's secrets in everything that comes back (before it is
        #: recorded, reduced or shown).
        self.redactor = redactor or Redactor()
        self.writer = RunWriter(run, clock)
        #: Why the final state could not be written (the run directory is gone …).
        self.unrecorded: str | None = None

    def request_stop(self, reason: str) -> None:
        """Ask the run to stop (thread- and signal-safe). A second request forces."""
        self.stops.request(reason)

    def _read(self, host: str, proc: Process) -> None:
        try:
            for line in proc.lines():
                self._queue.put((host, line))
        finally:
            self._queue.put((host, None))

    def _start_agents(self, attempt: int = 0) -> list[Event]:
        events: list[Event] = []
        for host in self.plan.hosts:
            try:
                warm = self.standbys.take(host.name) if self.standbys is not None else None
                proc = warm or self.transports[host.name].start(host.agent_argv, cwd=host.agent_cwd)
            except Exception as e:
                cause = RootCause(host.name, None, type(e).__name__, f"cannot start agent: {e}")
                events.append(AgentExited(host.name, 127, (), self.clock(), cause))
                self._lost_hosts[host.name] = f"cannot start agent: {e}"
                continue
            proc.send(self.plan.agent_config(host, attempt, self.stop_grace).to_json())
            self._procs[host.name] = proc
            threading.Thread(target=self._read, args=(host.name, proc), daemon=True).start()
        return events

    def _warm_up(self, running: set[str]) -> None:
        """Let every host still running ranks get its standby agent (when it is due)."""
        if self.standbys is None:
            return
        now = time.monotonic()
        for host in self.plan.hosts:
            since = self._running_since.get(host.name)
            if host.name in running and since is not None:
                self.standbys.warm_up(host, now - since)

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
        cause = RootCause(host, None, "AgentLost", msg, tail)
        return AgentExited(host, code if code is not None else -1, tail, self.clock(), cause)

    def run(self, resume_from: RunState | None = None) -> RunState:
        """Run the plan to its end, restarting it as ``decide`` says; returns the final
        state (also persisted). ``resume_from`` is the last state of the same run whose
        controller died (or that failed for a full disk: its root cause becomes one of
        its failures): the run goes on as its next attempt (ranks resume from their
        checkpoints), keeping its restart count and failures."""
        plan = self.plan
        recorder = self.writer
        attempt = 0
        if resume_from is None:
            state = new_run_state(
                plan.run_id, plan.job_name, plan.strategy,
                [(r.rank, r.host, r.role) for r in plan.ranks], self.clock(),
            )  # fmt: skip
        else:
            attempt = resume_from.restarts + 1
            lost = resume_from.root_cause or RootCause(
                CONTROLLER, None, "ControllerLost",
                "the controller died; resumed with dmlctl launch --resume", (), self.clock(),
            )  # fmt: skip
            state = dataclasses.replace(resume_from, phase=Phase.RUNNING, ended_at=None,
                                        exit_code=None, stop_reason=None)  # fmt: skip
            state = self._step(state, [Restarting(attempt, lost, 0.0, self.clock())], recorder)
        state = self._step(state, self.writer.start(), recorder)  # a full disk stops here
        if resume_from is not None and state.root_cause is None:
            state = self._between_attempts(state, recorder)
        while state.root_cause is None and state.phase != Phase.STOPPING:
            state = self._run_attempt(state, recorder, attempt)
            if state.root_cause is None or self._stopping():
                break  # succeeded, or stopped: nothing to restart
            delay = self.decide(state)
            if delay is None:
                break
            attempt += 1
            event = Restarting(attempt, state.root_cause, delay, self.clock())
            state = self._step(state, [event], recorder)
            state = self._step(state, self.writer.state(state), recorder)
            if not self._backoff(delay):
                state = self._step(state, [StopRequested(self.stops.reason or "", self.clock())],
                                   recorder)  # fmt: skip
                break
            state = self._between_attempts(state, recorder)
        if self.standbys is not None:
            self.standbys.close()
        if self.replicator is not None:
            self.replicator.drain(FINAL_COPY_WAIT)  # the last checkpoint, if still copying
            self.replicator.close()
        state = self._step(state, [*self._take_inbox(), Finished(self.clock())], recorder)
        self.unrecorded = self.writer.finish(state)
        self.sink.close(state)
        return state

    def _between_attempts(self, state: RunState, recorder: RunWriter) -> RunState:
        """Place the next attempt on the hosts that answer and hand them the newest
        checkpoint. A run that cannot go on gets its root cause here (``HostsLost``)."""
        lost, self._lost_hosts = self._lost_hosts, {}
        if self.hosts is None:
            return state
        for host, why in lost.items():
            self.hosts.lose(host, why)
        notes: list[str] = []

        def note(text: str) -> None:
            if not notes or notes[-1] != text:
                notes.append(text)
                self._step(state, [Progress(text, self.clock())], recorder)
            self.sink.tick()

        try:
            avail = self.hosts.next_hosts(lost, stopping=self._stopping, note=note)
            if avail is None:
                return self._step(state, [StopRequested(self.stops.reason or "", self.clock())],
                                  recorder)  # fmt: skip
            plan = place(self.base_plan, self.plan, avail, self.rendezvous)
        except (HostsLost, CannotReplan) as e:
            host = next(iter(lost), self.plan.hosts[0].name)
            cause = RootCause(host, None, "HostsLost", str(e), (), self.clock())
            return self._step(state, [AgentExited(host, 255, (), self.clock(), cause)], recorder)
        if [h.name for h in plan.hosts] != [h.name for h in self.plan.hosts]:
            names = ", ".join(h.name for h in plan.hosts)
            gone = sorted({h.name for h in self.plan.hosts} - {h.name for h in plan.hosts})
            why = f" ({', '.join(gone)} set aside)" if gone else ""
            ranks = tuple((r.rank, r.host, r.role) for r in plan.ranks)
            text = f"next attempt on {names}: {plan.world_size} workers{why}"
            state = self._step(state, [Resized(ranks, text, self.clock())], recorder)
        self.plan = plan
        self.hosts_used.update({h.name: h for h in plan.hosts})
        if self.replicator is not None:
            self.replicator.track(plan.hosts)
            for problem in self.replicator.hand_out(plan.hosts):
                state = self._step(state, [Progress(problem, self.clock())], recorder)
        return state

    def _take_inbox(self) -> list[Event]:
        out: list[Event] = []
        while True:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                return out

    def post(self, event: Event) -> None:
        """Hand an event over from another thread (the checkpoint copier)."""
        self._inbox.put(event)

    def _stopping(self) -> bool:
        return self.stops.reason is not None

    def _backoff(self, delay: float) -> bool:
        """Wait ``delay`` seconds (the dashboard keeps ticking); False if a stop came."""
        end = time.monotonic() + delay
        while time.monotonic() < end:
            if self._stopping():
                return False
            self.sink.tick()
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
        return not self._stopping()

    def _run_attempt(self, state: RunState, recorder: RunWriter, attempt: int) -> RunState:
        """Start every agent and follow them until all have exited."""
        plan = self.plan
        self._procs = {}
        self._stderr = StderrTails()  # the stderr tails of this attempt only
        self._lost_hosts = {}
        self._running_since = {}
        self._probe = None
        hosts = ", ".join(h.name for h in plan.hosts)
        what = "starting" if attempt == 0 else f"restarting (attempt {attempt + 1})"
        first: list[Event] = [Progress(f"{what} host agents on {hosts}", self.clock())]
        first += self._start_agents(attempt)
        run = _Attempt(live=set(self._procs))
        run.exited = {e.host for e in first if isinstance(e, AgentExited)}
        state = self._step(state, first, recorder)
        self.liveness.reset(run.live)
        self.hangs.reset()
        turn = time.monotonic()
        while run.live:
            batch: list[Event] = self._take_inbox() + self._read_events(run) + recorder.check()
            now = self.clock()
            turn, stood = time.monotonic(), time.monotonic() - turn
            if stood > STALL_S:  # this loop was blocked (a full terminal, a slow disk):
                self.liveness.shift(stood)  # nothing could arrive meanwhile, so that
                self.hangs.shift(stood)  # time is nobody's silence
            for host in self.liveness.silent(run.live - run.exited):
                run.exited.add(host)
                why = f"no message from the host for {self.host_timeout:.0f} s (unreachable?)"
                batch.append(self._lost(host, why))
                self._procs[host].kill()
            batch += self.stops.apply(run.stops, self._procs, run.live, state, batch, now)
            self.sink.tick()
            before = state.phase
            if batch:
                state = self._step(state, batch, recorder)
            if run.stops.stop_sent is None:  # judged on the state with every event so far
                found = self._watch_hangs(state, run)
                if found:
                    state = self._step(state, found, recorder)
                    batch += found
                if state.root_cause is None:
                    self._warm_up(run.live - run.exited)
            changed = state.phase != before
            if changed or (batch and now - run.last_persist >= self.persist_interval):
                state = self._step(state, recorder.state(state), recorder)
                run.last_persist = now
        return state

    def _read_events(self, run: _Attempt) -> list[Event]:
        """The events of the agent messages waiting now (at most 0.1 s for the first)."""
        batch: list[Event] = []
        items = self._drain()
        now = self.clock()
        for host, line in items:
            if line is None:
                run.live.discard(host)
                if host not in run.exited:
                    batch.append(self._lost(host, killed=host in run.stops.killed))
                continue
            self.liveness.heard(host)
            for ev in parse_line(host, line, now):
                batch.append(ev)
                if not isinstance(ev, ProcSample):  # more than a keepalive: still streaming
                    run.stops.data_at[host] = now
                if isinstance(ev, AgentExited):
                    run.exited.add(ev.host)
                elif isinstance(ev, CheckpointSaved) and self.replicator is not None:
                    self.replicator.saved(ev.host, ev.step)
                elif isinstance(ev, RankStarted):
                    self._running_since.setdefault(ev.host, time.monotonic())
                elif isinstance(ev, AgentStarted):
                    batch.append(Progress(
                        f"torchrun started on {host}; waiting for rendezvous "
                        f"({self.plan.world_size} workers)", now))  # fmt: skip
        return batch

    def _watch_hangs(self, state: RunState, run: _Attempt) -> list[Event]:
        """A hang verdict asks every agent for stack dumps; once they are in and it still
        holds on newer beats (or ``dump_wait`` passed) it becomes the culprit's ``Hang``
        exit. A verdict that no longer holds is withdrawn (the stacks stay on disk)."""
        now = time.monotonic()
        if self._probe is None:
            verdict = self.hangs.check(state)
            if verdict is None:
                return []
            asked = {h for h in run.live - run.exited if self._procs[h].send("dump")}
            self._probe = HangProbe(verdict, asked, now + self.dump_wait, self.clock(),
                                    confirm_at=now + min(CONFIRM_S, self.dump_wait))  # fmt: skip
            note = f"rank {verdict.rank} on {verdict.host} seems hung ({verdict.reason})"
            return [Progress(f"{note}; taking every rank's stacks", self.clock())]
        if not self._probe.done(now):
            return []
        probe, self._probe = self._probe, None
        if not self.hangs.confirm(state, probe.verdict):
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

    def _step(self, state: RunState, batch: list[Event], recorder: RunWriter) -> RunState:
        if not batch:
            return state
        batch = self._stderr.attach(redact_events(self.redactor, batch))
        for ev in batch:
            if isinstance(ev, Heartbeat):
                self.hangs.beat(ev)
            elif isinstance(ev, RankExited):
                self.hangs.exited(ev)
            elif isinstance(ev, ProcSample):
                self.hangs.sample(ev)
            elif isinstance(ev, (StackDump, StacksDumped)) and self._probe is not None:
                self._probe.take(ev)
        state = apply(state, batch)
        failed = recorder.record(batch)  # a full disk, a deleted run directory
        if failed:
            state = apply(state, failed)
            batch = [*batch, *failed]
        self.sink.on_events(batch, state)
        return state


@dataclasses.dataclass
class _Attempt:
    """The supervisor's bookkeeping of one attempt (hosts, stop deadlines)."""

    live: set[str]
    exited: set[str] = dataclasses.field(default_factory=set)
    stops: AttemptStops = dataclasses.field(default_factory=AttemptStops)
    last_persist: float = 0.0
