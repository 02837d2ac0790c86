"""Secrets hidden in everything that comes back from the hosts, before it is shown,
stored or reduced into the run state (one place, so no sink or file can miss it).
The rank files, written as the ranks printed, are masked by :mod:`dmlctl.masking`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dmlctl.failure import Failure
from dmlctl.plan.model import LaunchPlan
from dmlctl.redact import Redactor
from dmlctl.runs.events import Event, LogLines, StackDump


def redactor_of(plan: LaunchPlan) -> Redactor:
    """What hides the run's secrets (:meth:`~dmlctl.plan.model.LaunchPlan.hidden_values`)
    and the password of any URL (:mod:`dmlctl.redact`)."""
    return Redactor(plan.hidden_values())


def redact_events(redactor: Redactor, events: Sequence[Event]) -> list[Event]:
    """``events`` with secrets hidden in every text they carry: log lines, stack dumps,
    causes, progress, metric values, reasons (a field of any event, so no new event
    can carry a secret past this). Costs one search over a batch's log text when
    nothing is to be hidden."""
    out: list[Event] = []
    for ev in events:
        if isinstance(ev, LogLines | StackDump):  # the bulk: one search per batch
            if redactor.needed("\n".join(ev.lines)):
                ev = dataclasses.replace(ev, lines=tuple(map(redactor.text, ev.lines)))
        else:
            changed = {
                f.name: shown
                for f in dataclasses.fields(ev)
                if (value := getattr(ev, f.name)) is not (shown := _hidden(redactor, value))
            }
            if changed:
                ev = dataclasses.replace(ev, **changed)
        out.append(ev)
    return out


def _hidden(redactor: Redactor, value: Any) -> Any:
    """``value`` with secrets hidden in its text (the same object when none was)."""
    if isinstance(value, str):
        return redactor.text(value) if redactor.needed(value) else value
    if isinstance(value, Failure):
        return _cause(redactor, value)
    if isinstance(value, tuple) and value and isinstance(value[0], str):
        shown = tuple(_hidden(redactor, v) for v in value)
        return value if shown == value else shown
    if isinstance(value, Mapping) and any(isinstance(v, str) for v in value.values()):
        hidden = {k: _hidden(redactor, v) for k, v in value.items()}
        return value if all(hidden[k] is value[k] for k in value) else hidden
    return value


def _cause(redactor: Redactor, cause: Failure) -> Failure:
    text = "\n".join((cause.message, *cause.traceback))
    if not redactor.needed(text):
        return cause
    return dataclasses.replace(
        cause,
        message=redactor.text(cause.message),
        traceback=tuple(redactor.text(t) for t in cause.traceback),
    )
