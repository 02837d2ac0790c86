"""``dmlctl status [RUN_ID] [--json]``."""

from __future__ import annotations

import json
import time
from typing import Optional

import typer

from dmlctl.cli.common import stdout_console


def status(
    run_id: Optional[str] = typer.Argument(  # noqa: UP045 - typer needs Optional
        None, help="A run id (or a unique prefix, or 'last'); default: all runs."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> int:
    """Show runs, from the run directories (works after the launching terminal closed)."""
    from dmlctl.runs.store import RunStore
    from dmlctl.ui.summary import render_run_detail, render_run_list

    store = RunStore()
    if run_id is not None:
        state = store.get(run_id).read_state()
        if as_json:
            print(json.dumps(state.to_dict(), indent=1))
        else:
            stdout_console().print(render_run_detail(state, time.time()))
        return 0
    states = [run.read_state() for run in store.runs()]
    if as_json:
        print(json.dumps([s.to_dict() for s in states], indent=1))
    else:
        stdout_console().print(render_run_list(states, time.time()))
    return 0


def register(app: typer.Typer) -> None:
    app.command()(status)
