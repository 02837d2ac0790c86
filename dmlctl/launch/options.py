"""What ``dmlctl launch`` was asked (:class:`LaunchOptions`) and what it answers
(:class:`LaunchResult`): shared by the launch, its schedulers, ``--resume`` and the
benches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dmlctl.ui.sinks import UiMode

if TYPE_CHECKING:
    from dmlctl.runs.state import RunState


@dataclass(frozen=True)
class LaunchOptions:
    detach: bool = False
    dry_run: bool = False
    ui: UiMode = "auto"
    home: Path | None = None
    job_file: Path | None = None
    cluster_file: Path | None = None
    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False
    #: Job keys set by command-line flags (``workers`` for ``--workers``): problems
    #: with them name the flag, not a line of the job file.
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchResult:
    """``run_dir`` is None for a dry run; ``state`` is None unless the run ran here."""

    run_id: str
    run_dir: Path | None
    state: RunState | None
    exit_code: int
