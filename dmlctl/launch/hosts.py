"""Which hosts a restarted attempt runs on: lost hosts are set aside, spares step in.

Rules (``restart:`` settings of the job, bounds from the plan):

* a host whose agent was lost (connection dropped, silent for ``host_timeout``, agent
  could not start) is set aside for ``host_cooldown`` seconds;
* before each restart every candidate host that is not set aside is probed (a no-op
  command through its transport, in parallel); a host that does not answer is set
  aside too. A host whose cooldown is over is probed again and re-admitted when it
  answers;
* the attempt runs on the available hosts in cluster order, at most ``max_hosts``
  (see :func:`dmlctl.plan.elastic.pick_hosts`). With fewer than ``min_hosts``
  available it waits, probing the hosts set aside every ``PROBE_EVERY`` seconds
  (their cooldown does not apply then), up to ``host_wait`` seconds; then the run
  fails with :class:`HostsLost`, naming the hosts and why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from dmlctl.errors import DmlctlError
from dmlctl.plan.elastic import candidates, enough, pick_hosts
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.runs.events import Resized
from dmlctl.transport.fanout import on_every

PROBE_EVERY = 2.0


class HostsLost(DmlctlError):
    """Too few hosts answer to go on; the message names them."""


Probe = Callable[[HostPlan], str | None]  # None: the host answers; else why not


class HostPool:
    """The hosts of a run and which of them are set aside (see the module docstring).

    ``probe`` checks one host (None when it answers, else the reason); ``clock`` and
    ``sleep`` are injectable so tests need no real hosts or waiting.
    """

    def __init__(
        self,
        plan: LaunchPlan,
        probe: Probe,
        *,
        wait: float,
        cooldown: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.plan = plan
        self.probe = probe
        self.wait = wait
        self.cooldown = cooldown
        self.clock = clock
        self.sleep = sleep
        self.aside: dict[str, float] = {}  # host → when its cooldown ends
        self.why: dict[str, str] = {}  # host → the last reason it was set aside

    def renew(self, plan: LaunchPlan) -> None:
        """The run's hosts are new machines (a batch scheduler granted its request
        again): ``plan``'s, none of them set aside."""
        self.plan = plan
        self.aside.clear()
        self.why.clear()

    def lose(self, host: str, why: str) -> None:
        """Set ``host`` aside for the cooldown, remembering ``why``."""
        self.aside[host] = self.clock() + self.cooldown
        self.why[host] = why

    def _probe_all(self, hosts: Sequence[HostPlan]) -> dict[str, str | None]:
        return dict(zip((h.name for h in hosts), on_every(hosts, self.probe), strict=True))

    def available(self, *, ignore_cooldown: bool = False) -> set[str]:
        """Probe the candidate hosts (those set aside only once their cooldown is
        over, or with ``ignore_cooldown``; this machine at once: it always answers,
        and a cooldown cannot make its next agent more likely to live); returns the
        names of those that answer. A host that does not answer is set aside (again)."""
        now = self.clock()
        ready = [
            h
            for h in candidates(self.plan)
            if ignore_cooldown or h.is_local or self.aside.get(h.name, now) <= now
        ]
        out: set[str] = set()
        for name, problem in self._probe_all(ready).items():
            if problem is None:
                out.add(name)
                self.aside.pop(name, None)
                self.why.pop(name, None)
            else:
                self.lose(name, problem)
        return out

    def next_hosts(
        self,
        lost: Collection[str],
        *,
        stopping: Callable[[], bool] = lambda: False,
        note: Callable[[str], None] = lambda _text: None,
    ) -> set[str] | None:
        """The hosts the next attempt may use, after setting ``lost`` aside; waits
        for enough of them up to ``wait`` seconds (``note`` is told why). None when
        ``stopping()`` turns true meanwhile. Raises :class:`HostsLost`."""
        for host in lost:
            if host not in self.aside:
                self.lose(host, self.why.get(host, "its agent was lost"))
        deadline = self.clock() + self.wait
        avail = self.available()
        while not enough(self.plan, avail):
            need = self.plan.min_hosts or len(self.plan.hosts)
            have = len(pick_hosts(self.plan, avail))
            missing = ", ".join(f"{h} ({self.why.get(h, 'set aside')})" for h in sorted(self.aside))
            if self.clock() >= deadline:
                raise HostsLost(
                    f"{have} of the {need} hosts the job needs (min_hosts) answer after "
                    f"waiting {self.wait:.0f} s; not answering: {missing or 'none'}"
                )
            note(f"waiting for hosts: {have} of {need} answer; lost: {missing}")
            if stopping():
                return None
            self.sleep(PROBE_EVERY)
            if stopping():
                return None
            avail = self.available(ignore_cooldown=True)
        return avail


def resized(last: LaunchPlan, plan: LaunchPlan, now: float) -> Resized:
    """The event that says the next attempt (``plan``) runs on other hosts than the
    ``last``."""
    names = ", ".join(h.name for h in plan.hosts)
    gone = sorted({h.name for h in last.hosts} - {h.name for h in plan.hosts})
    why = f" ({', '.join(gone)} set aside)" if gone else ""
    ranks = tuple((r.rank, r.host, r.role) for r in plan.ranks)
    text = f"next attempt on {names}: {plan.world_size} workers{why}"
    return Resized(ranks, text, now)
