"""``dmlctl bench accuracy``: parse the options, run :mod:`dmlctl.bench.accuracy`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLE, finish
from dmlctl.cli.bench.plot import check_plot, plot_option
from dmlctl.cli.common import stderr_console
from dmlctl.errors import UsageError


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
        help="Comma-separated (default: both): momentum, adam for digits; adamw, nesterov "
        "for lm, and sgd (plain SGD, lr 2) by name.",
    ),
    epochs: Optional[int] = typer.Option(  # noqa: UP045
        None, "--epochs", help="Training epochs per run (default: 20 for digits, 3 for lm)."
    ),
    as_json: bool = JSON_TABLE,
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
    named = task.optimizers + task.more_optimizers  # the latter only when named
    opts = list(task.optimizers) if optimizers is None else pick(optimizers, named, "optimizer")
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
    return finish("accuracy", report, render_accuracy_table, as_json, plot)
