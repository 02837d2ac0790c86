"""``dmlctl bench straggler``: parse the options, run :mod:`dmlctl.bench.straggler`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLE, finish, kept, noted, running
from dmlctl.cli.bench.plot import check_plot, plot_option


def straggler(
    steps: int = typer.Option(60, "--steps", help="Steps per worker and run (at least 20)."),
    step_sleep: float = typer.Option(
        0.03, "--step-sleep", help="Seconds of simulated compute per step (the straggler: 3×)."
    ),
    repeats: int = typer.Option(
        1, "--repeats", help="Runs per side; each worker's median steps/s counts."
    ),
    scenarios: str = typer.Option(
        "all",
        "--scenarios",
        help="Comma-separated: ssgd, asgd, ssp-s3, ssp-s12-burst, sync-ps-b1, or all.",
    ),
    as_json: bool = JSON_TABLE,
    plot: Optional[Path] = plot_option("relative steps/s per scenario, the goal dashed"),  # noqa: UP045
) -> int:
    """Fast workers' steps/s next to a 3× slower worker, relative to no straggler."""
    from dmlctl.bench.straggler import FACTOR, check_options, parse_scenarios, run_straggler_bench
    from dmlctl.bench.straggler_report import render_straggler_table, straggler_json
    from dmlctl.spec import default_cluster

    chosen = parse_scenarios(scenarios)
    check_options(steps, step_sleep, repeats)
    check_plot(plot)
    (results, run_ids), note = running(
        "running the straggler benchmark…",
        lambda err: kept(
            lambda: run_straggler_bench(
                chosen,
                steps=steps,
                step_sleep=step_sleep,
                repeats=repeats,
                console=err,
                cluster=default_cluster(),
            )
        ),
    )
    figures = straggler_json(
        results, steps=steps, step_sleep=step_sleep, factor=FACTOR, repeats=repeats, run_ids=run_ids
    )
    report = noted(figures, note)
    return finish(
        "straggler",
        report,
        lambda _: render_straggler_table(
            results, steps=steps, step_sleep=step_sleep, factor=FACTOR, repeats=repeats
        ),
        as_json,
        plot,
        runs=f"runs {', '.join(run_ids)}",
    )
