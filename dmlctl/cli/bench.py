"""``dmlctl bench comm``, ``ps``, ``launch``, ``strategies``, ``accuracy``, ``recovery``,
``straggler``, ``sparse``, ``logs``, ``hangs`` and ``parallel``.

Parse → call :mod:`dmlctl.bench` → render. stdout carries only the result (a table,
or JSON with ``--json``); progress goes to stderr. Library imports happen inside the
commands so ``dmlctl --help`` stays fast; torch is only ever imported by the ranks.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from dmlctl.cli import bench_advise
from dmlctl.cli.bench_plot import check_plot, plot_option, write_plot
from dmlctl.cli.common import stderr_console, stdout_console
from dmlctl.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(
    help="Benchmarks: collective bandwidth (comm), parameter-server push+pull against "
    "all-reduce (ps), launcher overhead (launch), "
    "strategy overhead and traffic (strategies), test accuracy of every strategy on real "
    "data or a language model's loss (accuracy), recovery after a killed worker (recovery), "
    "throughput next to a slowed worker under ssgd/asgd/ssp/sync-ps (straggler), cyclades "
    "against hogwild on sparse data (sparse), log lines carried (logs), hang verdicts on "
    "healthy and hung runs (hangs), memory and throughput of tensor, pipeline and FSDP "
    "layouts (parallel), which strategy reaches your job's target soonest "
    "(advise).",
    no_args_is_help=True,
)


@app.callback()
def _every_bench() -> None:
    """A SIGTERM to a bench (``timeout`` around it) is a Ctrl-C from here on: the run
    under way is stopped as Ctrl-C stops it, and the bench ends there (exit 130)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


@app.command()
def comm(
    cluster: Optional[Path] = typer.Option(  # noqa: UP045 - typer needs both
        None, "--cluster", "-c", help="Cluster spec; default: this machine, one worker per core."
    ),
    workers: Optional[int] = typer.Option(  # noqa: UP045
        None, "--workers", "-n", help="Number of ranks; default: every slot of the cluster."
    ),
    ops: str = typer.Option(
        "allreduce,allgather,broadcast", "--ops", help="Comma-separated collectives."
    ),
    min_bytes: str = typer.Option("1K", "--min-bytes", help="Smallest message (e.g. 1K)."),
    max_bytes: str = typer.Option("16M", "--max-bytes", help="Largest message (e.g. 16M)."),
    iters: int = typer.Option(20, "--iters", help="Timed calls per size."),
    warmup: int = typer.Option(5, "--warmup", help="Untimed calls per size before timing."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: Optional[Path] = plot_option("bus bandwidth against message size"),  # noqa: UP045
) -> int:
    """Measure allreduce / allgather / broadcast time and bus bandwidth (nccl-tests style)."""
    from dmlctl.bench.comm import run_comm_bench
    from dmlctl.bench.report import comm_json, parse_ops, parse_size, render_comm_table
    from dmlctl.spec import default_cluster, load_cluster_file

    check_plot(plot)
    op_names = parse_ops(ops)
    low, high = parse_size(min_bytes), parse_size(max_bytes)
    spec = load_cluster_file(cluster) if cluster is not None else default_cluster()
    err = stderr_console()
    with err.status("running the communication benchmark…"):
        results, run = run_comm_bench(
            spec,
            workers=workers,
            ops=op_names,
            min_bytes=low,
            max_bytes=high,
            iters=iters,
            warmup=warmup,
            console=err,
        )
    world = run.state.world_size if run.state is not None else (workers or spec.total_slots)
    report = {"run_id": run.run_id, **comm_json(results, world)}
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        stdout_console().print(render_comm_table(results, world))
        err.print(f"run {run.run_id}", markup=False)
    write_plot("comm", report, plot)
    return 0


@app.command()
def ps(
    workers: int = typer.Option(2, "--workers", "-n", help="Worker ranks (W)."),
    servers: int = typer.Option(1, "--servers", "-s", help="Parameter-server ranks (S)."),
    min_bytes: str = typer.Option("64K", "--min-bytes", help="Smallest gradient (e.g. 64K)."),
    max_bytes: str = typer.Option("16M", "--max-bytes", help="Largest gradient (e.g. 16M)."),
    iters: int = typer.Option(20, "--iters", help="Timed rounds / all-reduces per size."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed rounds / all-reduces per size."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: Optional[Path] = plot_option("bytes/s and their ratio by gradient size"),  # noqa: UP045
) -> int:
    """PS push+pull throughput against an all-reduce of the same bytes on this machine."""
    from dmlctl.bench.ps import local_bench_cluster, run_ps_bench
    from dmlctl.bench.ps_report import ps_json, ps_summary, render_ps_table
    from dmlctl.bench.report import parse_size
    from dmlctl.spec import default_cluster

    check_plot(plot)
    low, high = parse_size(min_bytes), parse_size(max_bytes)
    spec = local_bench_cluster(default_cluster(), workers + servers)
    err = stderr_console()
    with err.status(f"running the parameter-server benchmark ({workers} + {servers} ranks)…"):
        results, run = run_ps_bench(
            spec,
            workers=workers,
            servers=servers,
            min_bytes=low,
            max_bytes=high,
            iters=iters,
            warmup=warmup,
            console=err,
        )
    report = {"run_id": run.run_id, **ps_json(results, workers, servers)}
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        out = stdout_console()
        out.print(render_ps_table(results, workers, servers))
        out.print(ps_summary(results), markup=False)
        err.print(f"run {run.run_id}", markup=False)
    write_plot("ps", report, plot)
    return 0


@app.command()
def launch(
    repeats: int = typer.Option(5, "--repeats", help="Timed runs per launcher (at least 5)."),
    workers: int = typer.Option(2, "--workers", "-n", help="Local workers per run."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: Optional[Path] = plot_option("seconds per launch, every repeat"),  # noqa: UP045
) -> int:
    """Compare `dmlctl launch` with bare torchrun on a trivial job; print the ratio."""
    from dmlctl.bench.launch_overhead import render_launch_table, run_launch_bench
    from dmlctl.bench.runs import BenchPartial

    check_plot(plot)
    err = stderr_console()
    with err.status("timing dmlctl launch against bare torchrun…"):
        try:
            report = run_launch_bench(repeats, workers, console=err)
        except BenchPartial as stop:
            report = stop.result
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        stdout_console().print(render_launch_table(report))
    write_plot("launch", report, plot)
    return ended(err, report.get("partial"))


@app.command()
def strategies(
    steps: int = typer.Option(400, "--steps", help="Steps per run: 48 warm-up + a multiple of 8."),
    repeats: int = typer.Option(
        3, "--repeats", help="Runs per side for throughput and overlap (at least 3)."
    ),
    sections: str = typer.Option(
        "throughput,bytes,filters,overlap",
        "--sections",
        help="Comma-separated: throughput (dmlctl vs hand-written DDP), bytes (ssgd "
        "compressions), filters (model and push filters), overlap (asynchronous strategies).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    plot: Optional[Path] = plot_option("samples/s of every run, bytes/step by strategy"),  # noqa: UP045
) -> int:
    """Overhead against hand-written DDP, bytes/step of every compression and filter,
    and overlap's throughput ratio."""
    from dmlctl.bench.runs import BenchPartial
    from dmlctl.bench.strategies import parse_sections, run_strategy_bench
    from dmlctl.bench.strategies_report import render_strategies_table

    check_plot(plot)
    chosen = parse_sections(sections)
    err = stderr_console()
    with err.status("running the strategy benchmark…"):
        try:
            report = run_strategy_bench(steps, repeats, console=err, sections=chosen)
        except BenchPartial as stop:
            report = stop.result
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for table in render_strategies_table(report):
            stdout_console().print(table)
    write_plot("strategies", report, plot)
    return ended(err, report.get("partial"))


@app.command()
def accuracy(
    task_name: str = typer.Option(
        "digits",
        "--task",
        help="digits: a CNN's test accuracy on scikit-learn's digits; lm: a small "
        "transformer language model's validation loss on a generated text.",
    ),
    strategies: Optional[str] = typer.Option(  # noqa: UP045 - typer needs both
        None, "--strategies", help="Comma-separated rows (default: all), e.g. 'ssgd,bmuf'."
    ),
    optimizers: Optional[str] = typer.Option(  # noqa: UP045
        None,
        "--optimizers",
        help="Comma-separated (default: both): momentum, adam for digits; adamw, nesterov for lm.",
    ),
    epochs: Optional[int] = typer.Option(  # noqa: UP045
        None, "--epochs", help="Training epochs per run (default: 20 for digits, 3 for lm)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: Optional[Path] = plot_option("bars per strategy, the single process dashed"),  # noqa: UP045
) -> int:
    """Quality of every strategy (defaults) against one process: test accuracy on
    scikit-learn's digits, or a language model's validation loss (--task lm)."""
    from dmlctl.bench.accuracy import TASKS, pick, render_accuracy_table, run_accuracy_bench
    from dmlctl.bench.plan import announce

    check_plot(plot)
    if task_name not in TASKS:  # one task: "digits,lm" is not a list here
        raise UsageError(f"unknown task {task_name}; valid: {', '.join(TASKS)}")
    task = TASKS[task_name]
    by_name = {c.name: c for c in task.candidates}
    chosen = [by_name[n] for n in pick(strategies, list(by_name), "strategy")]
    opts = pick(optimizers, task.optimizers, "optimizer")
    err = stderr_console()
    runs = task.planned(1 + len(chosen), len(opts), task.epochs if epochs is None else epochs)
    announce(err, "accuracy", runs)
    with err.status(f"training on {task.name}…") as status:
        report = run_accuracy_bench(
            chosen,
            opts,
            task.epochs if epochs is None else epochs,
            lambda what: status.update(f"training on {task.name}: {what}…"),
            task,
        )
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        stdout_console().print(render_accuracy_table(report))
    write_plot("accuracy", report, plot)
    return 0


@app.command()
def recovery(
    repeats: int = typer.Option(3, "--repeats", help="Failures timed per launcher (at least 1)."),
    backoff: float = typer.Option(
        0.1, "--backoff", help="dmlctl's restart backoff_initial in seconds (its default: 1.0)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    plot: Optional[Path] = plot_option("recovery seconds of every repeat, stage times"),  # noqa: UP045
) -> int:
    """Seconds from a worker's SIGKILL to its first step after restart: dmlctl vs torchrun."""
    from dmlctl.bench.recovery import render_recovery_tables, run_recovery_bench
    from dmlctl.bench.runs import BenchPartial

    check_plot(plot)
    err = stderr_console()
    note = None
    with err.status("timing recovery under dmlctl and bare torchrun…"):
        try:
            report = run_recovery_bench(repeats, backoff=backoff, console=err)
        except BenchPartial as stop:
            report, note = stop.result, stop.note
    if as_json:
        print(json.dumps({**report.to_dict(), **({"partial": note} if note else {})}, indent=2))
    else:
        for table in render_recovery_tables(report):
            stdout_console().print(table)
    write_plot("recovery", report.to_dict(), plot)
    return ended(err, note)


@app.command()
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
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: Optional[Path] = plot_option("relative steps/s per scenario, the goal dashed"),  # noqa: UP045
) -> int:
    """Fast workers' steps/s next to a 3× slower worker, relative to no straggler."""
    from dmlctl.bench.runs import BenchPartial
    from dmlctl.bench.straggler import FACTOR, check_options, parse_scenarios, run_straggler_bench
    from dmlctl.bench.straggler_report import render_straggler_table, straggler_json
    from dmlctl.spec import default_cluster

    chosen = parse_scenarios(scenarios)
    check_options(steps, step_sleep, repeats)
    check_plot(plot)
    err = stderr_console()
    note = None
    with err.status("running the straggler benchmark…"):
        try:
            results, run_ids = run_straggler_bench(
                chosen,
                steps=steps,
                step_sleep=step_sleep,
                repeats=repeats,
                console=err,
                cluster=default_cluster(),
            )
        except BenchPartial as stop:
            (results, run_ids), note = stop.result, stop.note
    report = straggler_json(
        results, steps=steps, step_sleep=step_sleep, factor=FACTOR, repeats=repeats, run_ids=run_ids
    )
    report.update({"partial": note} if note else {})
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        stdout_console().print(
            render_straggler_table(
                results, steps=steps, step_sleep=step_sleep, factor=FACTOR, repeats=repeats
            )
        )
        err.print(f"runs {', '.join(run_ids)}", markup=False)
    write_plot("straggler", report, plot)
    return ended(err, note)


@app.command()
def sparse(
    workers: int = typer.Option(2, "--workers", "-n", help="Workers sharing the parameters."),
    samples: int = typer.Option(100_000, "--samples", help="Training samples (one epoch)."),
    batch_size: int = typer.Option(4, "--batch-size", help="Updates per optimizer step."),
    repeats: int = typer.Option(3, "--repeats", help="Runs per strategy (medians count)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: Optional[Path] = plot_option("samples/s of every run, the final loss"),  # noqa: UP045
) -> int:
    """cyclades against hogwild on sparse logistic regression: samples/s and loss."""
    from dmlctl.bench.runs import BenchPartial
    from dmlctl.bench.sparse import (
        check_options,
        render_sparse_table,
        run_sparse_bench,
        sparse_json,
    )
    from dmlctl.spec import default_cluster

    check_options(workers, samples, batch_size, repeats)
    check_plot(plot)
    err = stderr_console()
    note = None
    with err.status("running the sparse benchmark…"):
        try:
            runs = run_sparse_bench(
                workers=workers,
                samples=samples,
                batch_size=batch_size,
                repeats=repeats,
                console=err,
                cluster=default_cluster(),
            )
        except BenchPartial as stop:
            runs, note = stop.result, stop.note
    report = sparse_json(runs, workers=workers, samples=samples, batch_size=batch_size)
    report.update({"partial": note} if note else {})
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        stdout_console().print(render_sparse_table(report))
        err.print(f"runs {', '.join(report['run_ids'])}", markup=False)
    write_plot("sparse", report, plot)
    return ended(err, note)


@app.command()
def logs(
    lines: int = typer.Option(
        1_000_000, "--lines", help="Lines each of the 2 ranks prints as fast as it can."
    ),
    steps: int = typer.Option(20_000, "--steps", help="Iterations of the printing loop."),
    work_us: float = typer.Option(
        1000.0, "--work-us", help="Microseconds of compute per loop iteration."
    ),
    repeats: int = typer.Option(3, "--repeats", help="Loop runs per side (median counts)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: Optional[Path] = plot_option("loop seconds of every repeat, lines/s carried"),  # noqa: UP045
) -> int:
    """Log lines/s carried to the run directory, and a printing loop's slowdown."""
    from dmlctl.bench.logs import render_logs_table, run_logs_bench

    check_plot(plot)
    err = stderr_console()
    with err.status("running the log benchmark…"):
        report = run_logs_bench(
            lines=lines, steps=steps, work_us=work_us, repeats=repeats, console=err
        )
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        stdout_console().print(render_logs_table(report))
    write_plot("logs", report, plot)
    return 0


@app.command()
def hangs(
    runs: int = typer.Option(20, "--runs", help="Runs per scenario."),
    scenarios: str = typer.Option(
        "all",
        "--scenarios",
        help="Comma-separated: prep, gil, compile, eval, deadlock, sigstop, or all.",
    ),
    seconds: float = typer.Option(35.0, "--seconds", help="Length of the healthy stretch."),
    skew: float = typer.Option(32.0, "--skew", help="Rank 1's extra seconds in that stretch."),
    hang_timeout: Optional[float] = typer.Option(  # noqa: UP045 - typer needs Optional
        None, "--hang-timeout", help="restart.hang_timeout of the runs; default: the job default."
    ),
    burn: bool = typer.Option(True, "--burn/--no-burn", help="Keep one core busy meanwhile."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: Optional[Path] = plot_option("verdicts per scenario, delays to the verdict"),  # noqa: UP045
) -> int:
    """False hang verdicts on healthy runs; delay and culprit of real hangs."""
    from dmlctl.bench.hangs import SCENARIOS, render_hang_table, run_hang_bench

    check_plot(plot)
    chosen = SCENARIOS if scenarios == "all" else tuple(s.strip() for s in scenarios.split(","))
    err = stderr_console()
    with err.status("running the hang benchmark…"):
        report = run_hang_bench(
            runs=runs,
            scenarios=chosen,
            seconds=seconds,
            skew=skew,
            hang_timeout=hang_timeout,
            burn=burn,
            console=err,
        )
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        stdout_console().print(render_hang_table(report))
    write_plot("hangs", report, plot)
    return ended(err, report.get("partial"))


@app.command()
def parallel(
    steps: int = typer.Option(
        16, "--steps", help="Steps per run, the first 3 untimed (at least 5)."
    ),
    layouts: str = typer.Option(
        "all",
        "--layouts",
        help="Comma-separated: dp4 (the baseline), tp2-dp2, tp4, pp4-gpipe, pp4-1f1b, "
        "fsdp4, pp2-tp2, or all.",
    ),
    repeats: int = typer.Option(2, "--repeats", help="Runs per layout (medians count)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: Optional[Path] = plot_option("memory per rank and samples/s by layout"),  # noqa: UP045
) -> int:
    """Memory per rank and samples/s of the example transformer under tensor, pipeline
    and FSDP layouts on 4 workers, against plain data parallelism."""
    from dmlctl.bench.parallel import check_options, parse_layouts, run_parallel_bench
    from dmlctl.bench.parallel_report import render_parallel_table
    from dmlctl.bench.runs import BenchPartial

    chosen = parse_layouts(layouts)
    check_options(steps, repeats)
    check_plot(plot)
    err = stderr_console()
    with err.status("running the parallelism benchmark…"):
        try:
            report = run_parallel_bench(chosen, steps=steps, repeats=repeats, console=err)
        except BenchPartial as stop:
            report = stop.result
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        stdout_console().print(render_parallel_table(report))
    write_plot("parallel", report, plot)
    return ended(err, report.get("partial"))


def ended(err: Console, partial: str | None) -> int:
    """The bench's exit code: 0, or (``partial``: Ctrl-C ended it after that much, its
    results are printed) 130, saying so."""
    if partial is None:
        return 0
    err.print(f"partial results: {partial}", highlight=False, markup=False)
    return int(ExitCode.INTERRUPTED)


bench_advise.register(app)
