"""``dmlctl attach RUN``."""

from __future__ import annotations

import typer

from dmlctl.cli.common import stdout_console


def attach(
    run_id: str = typer.Argument(..., help="A run id (or a unique prefix, or 'last')."),
) -> int:
    """Show a running run's live dashboard (e.g. one started with --detach); Ctrl-C
    detaches and the run goes on. Exits with the run's code once it ended: 0
    succeeded, 1 failed, 130 stopped."""
    from dmlctl.errors import ExitCode
    from dmlctl.runs.store import RunStore
    from dmlctl.ui.attach import follow
    from dmlctl.ui.summary import render_summary

    run = RunStore().get(run_id)
    console = stdout_console()
    state = run.read_state()
    if state.phase.terminal:
        console.print(render_summary(state, str(run.path)))
        return int(state.exit_code or 0)
    state, ended = follow(run, console)
    if not ended:
        console.print(
            f"detached; run {run.run_id} goes on (dmlctl attach {run.run_id}, "
            f"dmlctl stop {run.run_id})",
            markup=False,
            highlight=False,
        )
        return int(ExitCode.OK)
    console.print(f"logs: {run.path}/logs", markup=False, highlight=False)
    return int(state.exit_code or 0)


def register(app: typer.Typer) -> None:
    app.command()(attach)
