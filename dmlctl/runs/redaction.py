"""Secrets hidden in everything that comes back from the hosts, before it is shown,
stored or reduced into the run state (one place, so no sink or file can miss it);
and, when the run ends, in the rank files its directory holds as the ranks wrote them
(:func:`mask_files`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dmlctl.failure import Failure
from dmlctl.plan.model import LaunchPlan
from dmlctl.redact import Redactor, args_secrets, command_secrets
from dmlctl.runs.events import Event, LogLines, StackDump


def redactor_of(plan: LaunchPlan) -> Redactor:
    """What hides the run's secrets: its env values that are secret by name or by
    value, the secret values in its hosts' arguments and its Slurm setup, the other
    values the plan hides (:attr:`~dmlctl.plan.model.LaunchPlan.secrets`: the job's
    ``secrets:``, its setup's), and the password of any URL (:mod:`dmlctl.redact`)."""
    hosts = (*plan.hosts, *plan.spares)
    more = [*plan.secrets, *(v for h in hosts for v in args_secrets(h.torchrun.args))]
    more += [plan.key] if plan.key else []
    if plan.allocation is not None and plan.allocation.setup:
        more += command_secrets(plan.allocation.setup)
    return Redactor.for_envs((h.env for h in hosts), more)


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


TEXT_FILES = (".log", ".stdout", ".stderr", ".jsonl", ".json", ".txt", ".yaml")
"""The files of a run directory that :func:`mask_files` reads: text dmlctl or a rank
wrote (never a checkpoint's tensors)."""
KEPT = ("secrets.json",)
"""What :func:`mask_files` leaves as it is: where the real values must stay."""


def mask_files(root: Path, redactor: Redactor) -> list[Path]:
    """Hide the secrets ``redactor`` knows in every text file under ``root`` (the rank
    files of this machine's hosts and those collected from the others, written by the
    ranks as they printed); each file changed is rewritten, line by line, in place of
    the old one, with its mode. Read in pieces: a flood of lines costs no memory.
    Returns the files changed."""
    changed = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in TEXT_FILES or path.name in KEPT or not path.is_file():
            continue
        try:
            if _needs(path, redactor):
                _rewrite(path, redactor)
                changed.append(path)
        except OSError:
            continue  # gone meanwhile, or unreadable: nothing dmlctl wrote
    return changed


_PIECE = 1 << 20
_OVERLAP = 8192  # more than any secret dmlctl knows (a job's secrets: 4096 at most)


def _needs(path: Path, redactor: Redactor) -> bool:
    """Whether ``path`` holds a secret, read a piece at a time (pieces overlap, so a
    secret across two is seen)."""
    tail = ""
    with open(path, "rb") as f:
        while piece := f.read(_PIECE):
            text = tail + piece.decode("utf-8", "surrogateescape")
            if redactor.needed(text):
                return True
            tail = text[-_OVERLAP:]
    return False


def _rewrite(path: Path, redactor: Redactor) -> None:
    """``path`` with its secrets hidden, line by line, replaced whole."""
    tmp = path.with_name(f".{path.name}.masking")
    with open(path, "rb") as src, open(tmp, "wb") as out:
        for line in src:
            text = line.decode("utf-8", "surrogateescape")
            out.write(redactor.text(text).encode("utf-8", "surrogateescape"))
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
