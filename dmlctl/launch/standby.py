"""Standby host agents: one warm agent per host, ready for the next attempt.

A host agent imports torchrun before it reads its configuration
(:mod:`dmlctl.agent.warm`), so an agent started while an attempt runs has that
start-up behind it when a restart needs it. :class:`Standbys` starts one per host
once that host's ranks have run ``warm_after`` seconds (a short run never pays for
one), hands it to the next attempt, and kills the unused ones when the run ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

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
        self._starting: set[str] = set()

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
            if busy or running_for < self.warm_after:
                return
            self._starting.add(host.name)
        threading.Thread(target=self._start, args=(host,), daemon=True).start()

    def _start(self, host: HostPlan) -> None:
        try:
            proc = self.transports[host.name].start(host.agent_argv, cwd=host.agent_cwd)
        except Exception:
            proc = None  # no standby: a restart starts a cold agent, as without
        with self._lock:
            self._starting.discard(host.name)
            if proc is not None:
                self._ready[host.name] = proc

    def close(self, wait: float = 3.0) -> None:
        """Kill every unused standby (it runs nothing yet: nothing is lost), after
        waiting up to ``wait`` seconds for those still being started."""
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                if not self._starting or time.monotonic() > deadline:
                    procs, self._ready = list(self._ready.values()), {}
                    break
            time.sleep(0.05)
        for proc in procs:
            proc.close_stdin()
            proc.kill()
