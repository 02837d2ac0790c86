"""``dmlctl logs RUN_ID [--rank N] [--follow]``."""

from __future__ import annotations

from typing import Optional

import typer


def logs(
    run_id: str = typer.Argument(..., help="A run id (or a unique prefix, or 'last')."),
    rank: Optional[int] = typer.Option(  # noqa: UP045 - typer needs Optional
        None, "--rank", "-r", help="Only this rank (default: every rank, merged)."
    ),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the run ends."),
) -> int:
    """Print a run's logs from its run directory."""
    from dmlctl.runs.logs import stream_log
    from dmlctl.runs.store import RunStore

    run = RunStore().get(run_id)
    stream_log(run, rank, follow=follow)
    return 0


def register(app: typer.Typer) -> None:
    app.command()(logs)
