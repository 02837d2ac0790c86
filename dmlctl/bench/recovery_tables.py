"""The tables of ``dmlctl bench recovery`` (:mod:`dmlctl.bench.recovery`): recovery
seconds and steps lost per side with the ratio rows, and where the time goes."""

from __future__ import annotations

from rich.table import Table

from dmlctl.bench.recovery import (
    IN_PLACE,
    RATIO_GOAL,
    SURVIVOR_GOAL,
    RecoveryReport,
)
from dmlctl.bench.recovery_timing import STAGES
from dmlctl.text import plural


def render_recovery_tables(report: RecoveryReport) -> list[Table]:
    """Two tables: recovery seconds (median/min/max) and steps lost per side with the
    ratio rows (and, with the in-place side, the survivors' rate); then the median
    end of every stage, in seconds after the kill."""
    names = tuple(report.runs)
    t = Table(
        title=f"recovery from a SIGKILL, {plural(len(report.runs['dmlctl']), 'run')} each, "
        f"dmlctl backoff {report.backoff_s:g} s, ranks {report.ranks_start}"
        + ("" if report.hosts == "this machine" else f", dmlctl on {report.hosts}"),
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for name in ("launcher", "median (s)", "min (s)", "max (s)", "steps lost (max)"):
        t.add_column(name, justify="left" if name == "launcher" else "right")
    for side in names:
        secs = [r.seconds for r in report.runs[side]]
        t.add_row(
            f"dmlctl in_place ({report.in_place_strategy})" if side == IN_PLACE else side,
            f"{report.median(side):.3f}",
            f"{min(secs):.3f}",
            f"{max(secs):.3f}",
            str(report.steps_lost(side)),
            end_section=side == names[-1],
        )
    t.add_row(
        "[bold]dmlctl/torchrun[/bold]",
        f"[bold]{report.ratio:.3f}[/bold]",
        f"goal ≤ {RATIO_GOAL}",
        "",
        f"goal ≤ {report.checkpoint_every}",
    )
    if report.in_place_ratio is not None:
        t.add_row(
            "[bold]in_place/torchrun[/bold]",
            f"[bold]{report.in_place_ratio:.3f}[/bold]",
            f"goal ≤ {report.in_place_goal}",
            "",
            "goal 0",
        )
        rate = report.survivor_rate
        t.add_row(
            "survivor steps/s after ÷ before",
            "[bold]-[/bold]" if rate is None else f"[bold]{rate:.3f}[/bold]",
            f"goal ≥ {SURVIVOR_GOAL}",
        )
    return [t, _stage_table(report, names)]


def _stage_table(report: RecoveryReport, names: tuple[str, ...]) -> Table:
    s = Table(
        title="where the time goes (median seconds after the kill when each stage ended)",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    s.add_column("stage")
    for side in names:
        s.add_column(side, justify="right")
    stages = {side: report.stages(side) for side in names}
    for key, meaning in STAGES:
        cells = [f"{stages[side][key]:.3f}" if key in stages[side] else "" for side in names]
        if any(cells):
            s.add_row(meaning, *cells)
    return s
