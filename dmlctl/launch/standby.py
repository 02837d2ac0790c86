"""Standby host agents: one warm agent per host, ready for the next attempt.

A host agent of a job with ``ranks.start: warm`` forks its zygote, which imports
torch, before it reads its configuration (:mod:`dmlctl.agent.zygote`), so an agent
started while an attempt runs has that start-up behind it when a restart needs it.
:class:`Standbys` starts one per host once that host's ranks have run ``warm_after``
seconds (a short run never pays for one), hands it to the next attempt, and kills
the unused ones when the run ends — or when the run's hosts move to other machines
(a Slurm requeue: :meth:`drop`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

from dmlctl.plan.model import HostPlan
from dmlctl.transport.base import Process, Transport

WARM_AFTER = 5.0  # seconds of running ranks on a host before its standby starts


class Standbys:
    """The standby agents of a run (thread-safe; starting one happens in the
    background, so the supervisor's loop never waits on a transport)."""

    def __init__(self, transports: Mapping[str, Transport], warm_after: float = WARM_AFTER):
        self.transports = transports
        self.warm_after = warm_after
        self._lock = threading.Lock()
        self._ready: dict[str, Process] = {}  # host → warm agent for the next attempt
        self._starting: dict[str, threading.Thread] = {}  # host → the thread starting one
        self._closed = False  # the run ended: a standby that starts now is stopped at once
        self._generation = 0  # bumped by drop: a standby started before it is stopped
        self._dropped: list[threading.Thread] = []  # starting when dropped: close joins them

    def take(self, host: str) -> Process | None:
        """The warm agent prepared on ``host``, if there is one and it still runs."""
        with self._lock:
            proc = self._ready.pop(host, None)
        if proc is not None and proc.wait(0) is not None:
            return None  # it died meanwhile (its host with it, perhaps)
        return proc

    def warm_up(self, host: HostPlan, running_for: float) -> None:
        """Start a standby on ``host`` whose ranks have run ``running_for`` seconds,
        unless it has one, is getting one, or has not run ``warm_after`` seconds."""
        with self._lock:
            busy = host.name in self._ready or host.name in self._starting
            if busy or self._closed or running_for < self.warm_after:
                return
            args = (host, self._generation)
            thread = threading.Thread(target=self._start, args=args, daemon=True)
            self._starting[host.name] = thread
        thread.start()

    def warm_up_all(
        self, running: Sequence[HostPlan], since: Mapping[str, float], spare: HostPlan | None
    ) -> None:
        """:meth:`warm_up` every host in ``running`` whose ranks started at ``since[host]``
        (``time.monotonic``), and ``spare``, the host a lost host's ranks would go to in
        place, as running since the first of them."""
        now = time.monotonic()
        for host in running:
            if host.name in since:
                self.warm_up(host, now - since[host.name])
        if spare is not None and since:
            self.warm_up(spare, now - min(since.values()))

    def _start(self, host: HostPlan, generation: int) -> None:
        try:
            proc = self.transports[host.name].start(host.agent_argv, cwd=host.agent_cwd)
        except Exception:
            proc = None  # no standby: a restart starts a cold agent, as without
        with self._lock:
            if self._starting.get(host.name) is threading.current_thread():
                del self._starting[host.name]
            late = self._closed or generation != self._generation
            if proc is not None and not late:
                self._ready[host.name] = proc
        if proc is not None and late:
            _stop(proc, STOP_WAIT)

    def drop(self) -> None:
        """Stop every unused standby, and each still being started once it has started
        (in the background: this never waits), while later ones may start again — for
        hosts that move to other machines (a Slurm requeue), whose old standbys must
        never run the next attempt. The transports are read anew for the next ones."""
        with self._lock:
            self._generation += 1
            procs, self._ready = list(self._ready.values()), {}
            self._dropped += self._starting.values()  # each stops what it starts
            self._starting = {}
        for proc in procs:
            threading.Thread(target=_stop, args=(proc, STOP_WAIT), daemon=True).start()

    def close(self, wait: float = 3.0) -> None:
        """Stop every unused standby (it runs nothing yet: nothing is lost), those
        still being started included, each as soon as it has started; returns once
        all have exited or ``wait`` seconds have passed."""
        deadline = time.monotonic() + wait
        with self._lock:
            self._closed = True
            procs, self._ready = list(self._ready.values()), {}
            starting = [*self._starting.values(), *self._dropped]
        for proc in procs:
            _stop(proc, max(0.0, deadline - time.monotonic()))
        for thread in starting:  # each stops its own agent once it has one
            thread.join(max(0.0, deadline - time.monotonic()))


STOP_WAIT = 2.0
"""Seconds a standby gets to exit after its stdin closed, before it is killed."""


def _stop(proc: Process, wait: float) -> None:
    """End a standby agent: close its stdin (it exits without starting anything), wait
    up to ``wait`` seconds for it to exit, then kill it (a no-op if it has exited)."""
    proc.close_stdin()
    proc.wait(wait)
    proc.kill()
