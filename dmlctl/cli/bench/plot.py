"""``--plot FILE`` of every ``dmlctl bench`` command: the option, the early check
that matplotlib is there, and drawing the bench's chart of its ``--json`` report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dmlctl.cli.common import stderr_console


def plot_option(what: str) -> Any:
    """The ``--plot FILE`` option of a bench: ``what`` the PNG shows."""
    return typer.Option(
        None, "--plot", metavar="FILE", help=f"Also write a PNG: {what} (needs matplotlib)."
    )


def check_plot(plot: Path | None) -> None:
    """Before a bench runs: UsageError (exit 2) when ``--plot`` is given without
    matplotlib, so a long run does not end without its picture."""
    if plot is not None:
        from dmlctl.ui.plot import require_matplotlib

        require_matplotlib("--plot")


def write_plot(bench: str, report: dict[str, Any], plot: Path | None) -> None:
    """Draw ``bench``'s chart of ``report`` (its ``--json`` shape) to ``plot``, if given,
    and say where on stderr."""
    if plot is None:
        return
    from dmlctl.bench.charts import write

    write(bench, report, plot)
    stderr_console().print(f"plot: {plot}", markup=False)
