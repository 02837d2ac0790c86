"""``dmlctl plot RUN [-o FILE]``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def plot(
    run_id: str = typer.Argument(..., help="A run id (or a unique prefix, or 'last')."),
    output: Optional[Path] = typer.Option(  # noqa: UP045 - typer needs Optional
        None, "--output", "-o", help="PNG to write; default: RUN_ID.png here."
    ),
) -> int:
    """Plot a run's loss, samples/s and communication share over time (per rank) to a
    PNG, the ranks replaced in place shaded while they logged nothing (and the ranks
    running over time in a panel of its own). Needs
    matplotlib: pip install 'dmlctl\\[plot]'."""
    from dmlctl.runs.store import RunStore
    from dmlctl.ui.plot import plot_run, require_matplotlib

    require_matplotlib()
    run = RunStore().get(run_id)
    out = output if output is not None else Path(f"{run.run_id}.png")
    state = run.read_state()
    title = f"{run.run_id} ({state.strategy}, {state.phase.value})"
    plot_run(run.path, out, title, state.replacements, state.world_size)
    print(out)
    return 0


def register(app: typer.Typer) -> None:
    app.command()(plot)
