"""``dmlctl bench``: one module per command (``comm``, ``ps``, ``launch``,
``strategies``, ``accuracy``, ``recovery``, ``straggler``, ``sparse``, ``logs``,
``hangs``, ``parallel``, ``advise``), each registered here on :data:`app`.

Parse → call :mod:`dmlctl.bench` → render. stdout carries only the result (a table,
or JSON with ``--json``); progress goes to stderr. Library imports happen inside the
commands so ``dmlctl --help`` stays fast; torch is only ever imported by the ranks.
"""

from __future__ import annotations

import signal

import typer

from dmlctl.cli.bench import (
    accuracy,
    advise,
    comm,
    hangs,
    launch,
    logs,
    parallel,
    ps,
    recovery,
    sparse,
    straggler,
    strategies,
)

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


COMMANDS = (
    comm.comm,
    ps.ps,
    launch.launch,
    strategies.strategies,
    accuracy.accuracy,
    recovery.recovery,
    straggler.straggler,
    sparse.sparse,
    logs.logs,
    hangs.hangs,
    parallel.parallel,
)
"""The commands, in the order ``dmlctl bench --help`` lists them (then ``advise``, which
brings its own help)."""
for command in COMMANDS:
    app.command()(command)
advise.register(app)
