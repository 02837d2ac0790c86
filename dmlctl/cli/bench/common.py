"""What every ``dmlctl bench`` command shares: the ``--json`` option, running the bench
under a status line, a partial report kept, the printing of the result and the exit
code of a bench that ended whole or in part."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from dmlctl.cli.bench.plot import write_plot
from dmlctl.cli.common import stderr_console, stdout_console
from dmlctl.errors import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

T = TypeVar("T")

JSON_TABLE = typer.Option(False, "--json", help="Print JSON instead of a table.")
"""``--json`` of a bench that prints one table."""
JSON_TABLES = typer.Option(False, "--json", help="Print JSON instead of tables.")
"""``--json`` of a bench that prints several tables."""


def ended(err: Console, partial: str | None) -> int:
    """The bench's exit code: 0, or (``partial``: Ctrl-C ended it after that much, its
    results are printed) 130, saying so."""
    if partial is None:
        return 0
    err.print(f"partial results: {partial}", highlight=False, markup=False)
    return int(ExitCode.INTERRUPTED)


def running(doing: str, run: Callable[[Console], T]) -> T:
    """``run(err)``'s result, ``err`` being the stderr console (where a bench says its
    progress), while a status line ``doing`` stands on it; what ``run`` raises passes."""
    err = stderr_console()
    with err.status(doing):
        return run(err)


def kept(run: Callable[[], T]) -> tuple[T, str | None]:
    """``run()``'s result and None; or, for a bench that Ctrl-C ended after some of its
    runs (:class:`~dmlctl.bench.runs.BenchPartial`), the result it kept and the note
    saying how much ran."""
    from dmlctl.bench.runs import BenchPartial

    try:
        return run(), None
    except BenchPartial as stop:
        return stop.result, stop.note


def noted(report: dict[str, Any], note: str | None) -> dict[str, Any]:
    """``report`` with ``partial``: ``note`` added last when a note says that Ctrl-C
    ended the bench after part of its runs (:func:`kept`); else ``report``'s items."""
    return {**report, **({"partial": note} if note else {})}


def whole_or_partial(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s report, or the partial report of a bench that Ctrl-C ended after
    some of its runs (:func:`kept`; the report says ``partial`` itself)."""
    report, _ = kept(run)
    return report


def finish(
    bench: str,
    report: dict[str, Any],
    render: Callable[[Any], Any],
    as_json: bool,
    plot: Any,
    *,
    runs: str | None = None,
) -> int:
    """Print ``report`` (JSON, or what ``render`` makes of it: a table, a line or a list
    of them, then ``runs`` on stderr: which runs they come from), draw its ``--plot``,
    and return the exit code (:func:`ended`; partial when the report says ``partial``)."""
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        rendered = render(report)
        out = stdout_console()
        for shown in rendered if isinstance(rendered, list) else [rendered]:
            if isinstance(shown, str):  # a line of text, printed as it is
                out.print(shown, markup=False)
            else:
                out.print(shown)
        if runs is not None:
            stderr_console().print(runs, markup=False)
    write_plot(bench, report, plot)
    return ended(stderr_console(), report.get("partial"))


def finish_run(
    bench: str,
    run_id: str,
    figures: dict[str, Any],
    render: Callable[[Any], Any],
    as_json: bool,
    plot: Any,
) -> int:
    """:func:`finish` for a bench of one dmlctl run: its report is ``run_id`` and
    ``figures``, and stderr says ``run <run_id>`` after the table."""
    report = {"run_id": run_id, **figures}
    return finish(bench, report, render, as_json, plot, runs=f"run {run_id}")
