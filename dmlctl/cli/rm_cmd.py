"""``dmlctl rm RUN…`` and ``dmlctl prune --older-than AGE``: remove finished runs."""

from __future__ import annotations

import time

import typer

from dmlctl.cli.common import stdout_console


def rm(
    run_ids: list[str] = typer.Argument(..., help="Run ids (or unique prefixes, or 'last')."),
) -> int:
    """Remove runs and everything they kept (logs, metrics, checkpoints under the run
    directory). A run still going is refused, and then nothing is removed."""
    from dmlctl.runs.housekeeping import remove
    from dmlctl.runs.store import RunStore

    store = RunStore()
    runs = [store.get(run_id) for run_id in run_ids]  # every id checked before any removal
    for run in runs:
        if run.controller_alive():
            remove(run)  # raises: still running
    console = stdout_console()
    for run in {r.run_id: r for r in runs}.values():
        remove(run)
        console.print(f"removed {run.run_id}", markup=False, highlight=False)
    return 0


def prune(
    older_than: str = typer.Option(
        ..., "--older-than", help="Age of the runs to remove: 30m, 12h, 7d, 2w."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; remove nothing."),
) -> int:
    """Remove the finished runs (succeeded, failed, stopped) that ended longer ago than
    --older-than. Lost runs (their controller died; 'launch --resume' continues them)
    and runs still going are kept."""
    from dmlctl.runs.housekeeping import parse_age
    from dmlctl.runs.housekeeping import prune as prune_runs
    from dmlctl.runs.store import RunStore
    from dmlctl.text import plural

    age = parse_age(older_than)
    done = prune_runs(RunStore(), age, time.time(), dry_run=dry_run)
    console = stdout_console()
    verb = "would remove" if dry_run else "removed"
    for run_id in done.removed:
        console.print(f"{verb} {run_id}", markup=False, highlight=False)
    summary = f"{verb} {plural(len(done.removed), 'run')} that ended over {older_than} ago"
    if done.kept_lost:
        summary += f"; kept {plural(len(done.kept_lost), 'lost run')} (dmlctl rm removes one)"
    console.print(summary, markup=False, highlight=False)
    return 0


def register(app: typer.Typer) -> None:
    app.command()(rm)
    app.command()(prune)
