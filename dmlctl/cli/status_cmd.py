"""``dmlctl status [RUN_ID] [--json]``."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Optional

import typer

from dmlctl.cli.common import stdout_console

if TYPE_CHECKING:
    from dmlctl.runs.store import RunDir


def status(
    run_id: Optional[str] = typer.Argument(  # noqa: UP045 - typer needs Optional
        None, help="A run id (or a unique prefix, or 'last'); default: all runs."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    show_all: bool = typer.Option(False, "--all", "-a", help="Every run, not only the newest."),
    limit: int = typer.Option(20, "--limit", "-n", help="Show the newest N runs."),
    running: bool = typer.Option(False, "--running", help="Only runs still going."),
    failed: bool = typer.Option(False, "--failed", help="Only failed runs."),
    name: Optional[str] = typer.Option(  # noqa: UP045
        None, "--name", help="Only runs of the job with this name."
    ),
) -> int:
    """Show runs, newest first, from the run directories (works after the launching
    terminal closed).

    A run whose state cannot be read is listed with the reason (exit 0); asked for
    by id, it is an error (exit 2)."""
    from dmlctl.errors import UsageError
    from dmlctl.runs.housekeeping import Filters, select
    from dmlctl.runs.state import Phase
    from dmlctl.runs.store import RunStore
    from dmlctl.ui.summary import render_run_list, render_unreadable

    store = RunStore()
    if run_id is not None:
        _detail(store.get(run_id), as_json)
        return 0
    if limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    phases = tuple(p for p in Phase if not p.terminal) if running else ()
    phases += (Phase.FAILED,) if failed else ()
    selection = select(store, Filters(phases, name), None if show_all else limit)
    listing = selection.rows
    if as_json:
        rows = [
            r.state.to_dict() if r.state else {"run_id": r.run_id, "error": r.error}
            for r in listing
        ]
        print(json.dumps(rows, indent=1))
        return 0
    console = stdout_console()
    states = [r.state for r in listing if r.state is not None]
    if not listing and selection.total:  # runs there are, but none the filters match
        _none_match(running, failed, name, selection.total)
        return 0
    if states or not listing:
        console.print(render_run_list(states, time.time(), console.width))
    for row in listing:
        if row.error is not None:
            console.print(render_unreadable(row.run_id, row.error))
    if selection.more:
        console.print(
            f"[dim]the newest {len(listing)} shown of {selection.total} runs; --all for "
            "every one ('dmlctl prune --older-than 7d' removes old ones)[/dim]",
            highlight=False,
        )
    return 0


def _none_match(running: bool, failed: bool, name: str | None, total: int) -> None:
    """Say that no run matches the filters, and how many runs there are."""
    from dmlctl.text import plural

    flags = [*(["--running"] if running else []), *(["--failed"] if failed else [])]
    flags += [f"--name {name}"] if name is not None else []
    stdout_console().print(
        f"[dim]no run matches {' '.join(flags)} ({plural(total, 'run')} in all: "
        "dmlctl status)[/dim]",
        highlight=False,
    )


def _detail(run: RunDir, as_json: bool) -> None:
    """One run: its state (``--json``: as recorded), then where its scheduler ran it."""
    from dmlctl.launch.pick import scheduler_of
    from dmlctl.ui.summary import render_run_detail

    state = run.read_state()
    if as_json:
        print(json.dumps(state.to_dict(), indent=1))
        return
    console = stdout_console()
    console.print(render_run_detail(state, time.time()))
    for line in scheduler_of(run).describe(run):
        console.print(line, markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command()(status)
