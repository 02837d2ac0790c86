"""``dmlctl stop RUN_ID``."""

from __future__ import annotations

from typing import Optional

import typer

from dmlctl.cli.common import stdout_console


def stop(
    run_id: str = typer.Argument(..., help="A run id (or a unique prefix, or 'last')."),
    timeout: Optional[float] = typer.Option(  # noqa: UP045 - typer needs Optional
        None,
        "--timeout",
        help="Seconds to wait for a clean stop; default: the job's restart.stop_grace + 10.",
    ),
) -> int:
    """Stop a run: every process of it, and nothing else. Its ranks get SIGTERM and the
    job's restart.stop_grace to save and exit."""
    from dmlctl.launch.pick import scheduler_of
    from dmlctl.runs.control import default_stop_timeout
    from dmlctl.runs.store import RunStore

    run = RunStore().get(run_id)
    wait = timeout if timeout is not None else default_stop_timeout(run)
    outcome = scheduler_of(run).cancel(run, timeout=wait)
    stdout_console().print(outcome, markup=False)
    return 0


def register(app: typer.Typer) -> None:
    app.command()(stop)
