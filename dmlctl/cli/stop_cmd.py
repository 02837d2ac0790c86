"""``dmlctl stop RUN_ID``."""

from __future__ import annotations

import typer

from dmlctl.cli.common import stdout_console


def stop(
    run_id: str = typer.Argument(..., help="A run id (or a unique prefix, or 'last')."),
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds to wait for a clean stop."),
) -> int:
    """Stop a run: every process of it, and nothing else."""
    from dmlctl.runs.control import stop_run
    from dmlctl.runs.store import RunStore

    outcome = stop_run(RunStore().get(run_id), timeout=timeout)
    stdout_console().print(outcome, markup=False)
    return 0


def register(app: typer.Typer) -> None:
    app.command()(stop)
