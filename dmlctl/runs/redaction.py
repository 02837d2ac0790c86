"""Secrets hidden in everything that comes back from the hosts, before it is shown,
stored or reduced into the run state (one place, so no sink or file can miss it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dmlctl.failure import Failure
from dmlctl.plan.model import LaunchPlan
from dmlctl.redact import Redactor
from dmlctl.runs.events import AgentExited, Event, LogLines, RankExited, StackDump


def redactor_of(plan: LaunchPlan) -> Redactor:
    """What hides the run's secrets: its env values that are secret by name or by
    value (:mod:`dmlctl.redact`), and the password of any URL."""
    return Redactor.for_envs(h.env for h in (*plan.hosts, *plan.spares))


def redact_events(redactor: Redactor, events: Sequence[Event]) -> list[Event]:
    """``events`` with secrets hidden in log lines, stack dumps and root causes.

    Costs one search over a batch's text when nothing is to be hidden."""
    out: list[Event] = []
    for ev in events:
        if isinstance(ev, LogLines | StackDump) and redactor.needed("\n".join(ev.lines)):
            ev = dataclasses.replace(ev, lines=tuple(redactor.text(t) for t in ev.lines))
        elif isinstance(ev, RankExited) and ev.cause is not None:
            ev = dataclasses.replace(ev, cause=_cause(redactor, ev.cause))
        elif isinstance(ev, AgentExited) and redactor.needed("\n".join(ev.tail)):
            cause = _cause(redactor, ev.cause) if ev.cause is not None else None
            ev = dataclasses.replace(ev, tail=tuple(map(redactor.text, ev.tail)), cause=cause)
        elif isinstance(ev, AgentExited) and ev.cause is not None:
            ev = dataclasses.replace(ev, cause=_cause(redactor, ev.cause))
        out.append(ev)
    return out


def _cause(redactor: Redactor, cause: Failure) -> Failure:
    text = "\n".join((cause.message, *cause.traceback))
    if not redactor.needed(text):
        return cause
    return dataclasses.replace(
        cause,
        message=redactor.text(cause.message),
        traceback=tuple(redactor.text(t) for t in cause.traceback),
    )
