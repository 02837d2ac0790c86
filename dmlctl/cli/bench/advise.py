"""``dmlctl bench advise``: parse the options into one validated request, run it
(:mod:`dmlctl.bench.advise`), print the tables and the recommendation. Registered on
the ``bench`` app by :func:`register`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from dmlctl.cli.bench.plot import check_plot, plot_option, write_plot
from dmlctl.cli.common import CLUSTER_OPTION, no_slurm, stderr_console, stdout_console

if TYPE_CHECKING:
    from dmlctl.bench.advise import AdviseRequest


ADVISE_HELP = """Run your job with each candidate strategy; rank them by time to your target.

Each candidate runs until it reaches the target or its budget is spent, once per
scenario (this machine or --cluster; each --lab bandwidth; --straggler): at most
candidates x scenarios x budget. Before it starts, the bench says how many runs it
plans and how long they may take.

Example: dmlctl bench advise job.yaml --target 'test_acc>=0.97' --budget 2m
"""
TARGET_HELP = (
    "When a candidate is done: METRIC>=VALUE or METRIC<=VALUE, where METRIC is any value "
    "your script logs (ctx.log(test_acc=...), loss, ...), e.g. 'test_acc>=0.97' or "
    "'loss<=0.1'. Quote it: the shell reads > and < as redirections."
)
BUDGET_HELP = (
    "Longest run per candidate and scenario (90s, 10m, 1h); the default with the 5 "
    "default candidates: up to 50 minutes per scenario."
)


def register(app: typer.Typer) -> None:
    """Add ``advise`` to the ``bench`` app."""
    app.command(help=ADVISE_HELP)(advise)


def advise(
    job_file: Path = typer.Argument(..., help="Your job file (job.yaml)."),
    target: str = typer.Option(..., "--target", help=TARGET_HELP),
    cluster: Optional[Path] = CLUSTER_OPTION,  # noqa: UP045 - typer needs both
    strategies: Optional[str] = typer.Option(  # noqa: UP045
        None,
        "--strategies",
        help="Comma-separated candidates, NAME or NAME:KEY=V;KEY=V with V1|V2 for a grid "
        "(default: ssgd, ssgd powersgd, local-sgd, bmuf, dpsgd).",
    ),
    budget: str = typer.Option("10m", "--budget", help=BUDGET_HELP),
    lab: Optional[list[str]] = typer.Option(  # noqa: UP045
        None,
        "--lab",
        metavar="BANDWIDTH",
        help="Also on a dmlctl lab network of this bandwidth, e.g. 100mbit (repeatable; root).",
    ),
    straggler: Optional[str] = typer.Option(  # noqa: UP045
        None, "--straggler", help="Also with the last worker this many times slower, e.g. 3x."
    ),
    run_to_end: bool = typer.Option(
        False, "--run-to-end", help="Keep each candidate running after it reached the target."
    ),
    save: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--save",
        metavar="FILE",
        help="Write the recommendation for `strategy: {name: auto, advice: FILE}`.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    plot: Optional[Path] = plot_option("the metric against time and bytes sent"),  # noqa: UP045
) -> int:
    """Run your job with each candidate strategy; rank them by time to your target
    (the help screen says more: :data:`ADVISE_HELP`)."""
    from dmlctl.bench.advise import planned, run_advice

    check_plot(plot)
    request = _advise_request(
        job_file, target, cluster, strategies, budget, lab or [], straggler, run_to_end
    )
    err = stderr_console()
    err.print(f"dmlctl bench advise: {planned(request)}", highlight=False, markup=False)
    with err.status("advising…") as status:
        report = run_advice(request, lambda what: status.update(f"running {what}…"))
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_advice(report)
    write_plot("advise", report, plot)
    if save is not None:
        from dmlctl.bench.advise import save_advice

        saved = save_advice(report, save)
        what = f"advice: {saved} in {save}" if saved else "no advice saved: no candidate reached"
        err.print(what, markup=False)
    return 0


def _advise_request(
    job_file: Path,
    target: str,
    cluster: Path | None,
    strategies: str | None,
    budget: str,
    labs: list[str],
    straggler: str | None,
    run_to_end: bool,
) -> AdviseRequest:
    """The validated :class:`~dmlctl.bench.advise.AdviseRequest` of the options;
    one-line errors (exit 2) before anything runs."""
    from dmlctl.bench.advise import AdviseRequest
    from dmlctl.bench.advise_spec import (
        DEFAULT_CANDIDATES,
        parse_budget,
        parse_candidates,
        parse_scenarios,
        parse_target,
    )
    from dmlctl.spec import load_cluster_file
    from dmlctl.spec.loader import load_job

    job = load_job(job_file)
    if cluster is not None:
        no_slurm(load_cluster_file(cluster), "bench advise", cluster)
    return AdviseRequest(
        job_file=job_file.resolve(),
        job=job,
        candidates=parse_candidates(strategies or DEFAULT_CANDIDATES, job.parameter_servers),
        target=parse_target(target),
        budget_s=parse_budget(budget),
        scenarios=parse_scenarios(None if cluster is None else cluster.resolve(), labs, straggler),
        run_to_end=run_to_end,
    )


def _print_advice(report: dict[str, Any]) -> None:
    """Per scenario: the ranked table, each row's run, the recommendation and the
    job-file lines for it; with several scenarios, how the ranking moves."""
    from dmlctl.bench.advise_report import advice_notes, moves_table, render_advice_table

    out = stdout_console()
    for scenario in report["scenarios"]:
        out.print(render_advice_table(scenario))
        for line in advice_notes(scenario):
            out.print(line, markup=False)
        best = scenario["recommendation"]
        if best is None:
            out.print(f"no candidate reached {report['target']} within the budget\n", markup=False)
            continue
        out.print(
            f"recommendation: {best['label']}: {best['why']}. In your job file:", markup=False
        )
        out.print(best["snippet"] + "\n", markup=False)
    if len(report["scenarios"]) > 1:
        out.print(moves_table(report))
