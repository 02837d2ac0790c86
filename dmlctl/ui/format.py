"""Shared formatting pieces of every dmlctl view (dashboard, status, end-of-run summary).

Everything here is pure: values in, strings or rich renderables out, no I/O and no
clock reads. User-controlled text (log lines, tracebacks, job names) always goes into
:class:`rich.text.Text` verbatim, never through console markup, so a log line such as
``[red]x[/red]`` is shown as written and can never break rendering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.text import Text

from dmlctl.failure import Failure
from dmlctl.mesh import MeshLayout, worker_ranks
from dmlctl.protocol import STAGE_SERVING
from dmlctl.runs.events import Stream
from dmlctl.runs.state import SEPARATOR, Phase, RankState, RankStatus, RunState, TailLine
from dmlctl.text import clean_line
from dmlctl.ui.metric_columns import COMMON, STRATEGY_COLUMNS, strategy_columns
from dmlctl.ui.numbers import compact_rate
from dmlctl.ui.progress import progress_line
from dmlctl.ui.rank_table import Column, RankTable, epoch_cell

MISSING = "-"
"""Shown where a value is not known yet (no metric reported, no exit code)."""

PHASE_STYLES: dict[Phase, str] = {
    Phase.PENDING: "dim",
    Phase.STARTING: "cyan",
    Phase.RUNNING: "bold blue",
    Phase.RESTARTING: "bold yellow",
    Phase.STOPPING: "yellow",
    Phase.SUCCEEDED: "bold green",
    Phase.FAILED: "bold red",
    Phase.STOPPED: "yellow",
    Phase.LOST: "magenta",
}

STATUS_STYLES: dict[RankStatus, str] = {
    RankStatus.PENDING: "dim",
    RankStatus.RUNNING: "blue",
    RankStatus.RECOVERING: "bold yellow",
    RankStatus.SUCCEEDED: "green",
    RankStatus.FAILED: "bold red",
    RankStatus.STOPPED: "yellow",
    RankStatus.DROPPED: "dim yellow",
    RankStatus.UNKNOWN: "dim",
}

# Red is kept for errors, so no rank prefix can be mistaken for a failure.
RANK_PALETTE = (
    "cyan",
    "magenta",
    "green",
    "yellow",
    "blue",
    "bright_cyan",
    "bright_magenta",
    "bright_green",
)
AGENT_STYLE = "bold white"
STDERR_STYLE = "dim red"

LAST_LINE_CHARS = 120
"""Hard cap on a log line shown in a table cell, before the column's own ellipsis."""


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (hours grow past 9, never days); negative input counts as zero."""
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def format_loss(value: float | None) -> str:
    """Four significant digits (``0.4321``, ``1.235e-05``), or ``-`` when unknown."""
    return MISSING if value is None else f"{value:.4g}"


def format_step(value: int | None) -> str:
    """The step number, or ``-`` before the first metric record."""
    return MISSING if value is None else str(value)


def truncate(text: str, limit: int) -> str:
    """``text`` unchanged if it has at most ``limit`` characters, else cut with ``…``."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + "…"


def rank_style(rank: int) -> str:
    """The colour of rank ``rank``'s prefix; stable for a rank across views."""
    return RANK_PALETTE[rank % len(RANK_PALETTE)]


def phase_text(phase: Phase) -> Text:
    """The phase name in its colour."""
    return Text(phase.value, style=PHASE_STYLES[phase])


def status_text(rank: RankState) -> Text:
    """The rank's status in its colour, with the exit code when it was non-zero; a
    running rank that has not stepped yet says what it does instead (``importing``,
    ``joining``, ``first step``: its heartbeat's start-up stage)."""
    label = rank.status.value
    serving = rank.stage == STAGE_SERVING  # a parameter server: its steps are pushes served
    if rank.status is RankStatus.RUNNING and rank.stage and (rank.step is None or serving):
        label = rank.stage
    if rank.peer_failed and rank.status is RankStatus.STOPPED:
        label = f"{label} (peer failed)"  # its own end was the failed peer's consequence
    elif rank.exit_code not in (None, 0):
        label = f"{label} ({rank.exit_code})"
    return Text(label, style=STATUS_STYLES[rank.status])


def tail_text(line: TailLine) -> Text:
    """One merged-log line: ``[rank N]`` (coloured per rank) or ``[host]`` for the agent.

    stderr text is dimmed red; the line never wraps (it ends in ``…`` when too wide).
    """
    if line.host == SEPARATOR and line.rank is None:  # where the next attempt begins
        return Text(f"── {line.text} ──", style="dim", no_wrap=True, overflow="ellipsis")
    if line.rank is None:
        prefix = Text(f"[{line.host}]", style=AGENT_STYLE)
    else:
        prefix = Text(f"[rank {line.rank}]", style=rank_style(line.rank))
    body_style = STDERR_STYLE if line.stream is Stream.STDERR else ""
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append_text(prefix)
    out.append(" ")
    out.append(truncate(clean_line(line.text), 4 * LAST_LINE_CHARS), style=body_style)
    return out


def _rejoining(state: RunState) -> list[tuple[str, str]]:
    """`` (1 rejoining)`` while ranks replaced in place have not trained yet."""
    n = sum(r.status is RankStatus.RECOVERING for r in state.ranks)
    return [(f" ({n} rejoining)", "bold yellow")] if n else []


class Fields:
    """Texts in a line, two spaces apart; one that does not fit the width goes whole to
    the next line (a narrow terminal never cuts ``hosts 1`` in two)."""

    def __init__(self, fields: Sequence[Text]) -> None:
        self.fields = fields

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = Text()
        for field in self.fields:
            if line.cell_len and line.cell_len + 2 + field.cell_len > options.max_width:
                yield line
                line = Text()
            if line.cell_len:
                line.append("  ")
            line.append_text(field)
        yield line


def run_header(state: RunState, now: float, *, marker: str | None = None) -> RenderableType:
    """Two lines: identity (run, job, strategy) then phase, elapsed, restarts, world,
    hosts and the newest checkpoint (with the controller's copy, when there is one).

    ``marker`` (a spinner frame) is put before ``state.detail`` when given; the detail
    line is shown only when there is something to say (progress text, stop reason).
    """
    ident = Text.assemble(
        ("run ", "dim"),
        (state.run_id, "bold"),
        ("  job ", "dim"),
        (state.job, ""),
        ("  strategy ", "dim"),
        (state.strategy_label(), ""),
    )
    fields = [
        phase_text(state.phase),
        Text.assemble(("elapsed ", "dim"), format_duration(state.elapsed(now))),
        Text.assemble(
            ("restarts ", "dim"),
            (str(state.restarted), "yellow" if state.restarted else ""),
            *([(f" (+{state.respawns} in place)", "yellow")] if state.respawns else []),
            *([(f" (resumed {state.resumes}×)", "yellow")] if state.resumes else []),
        ),
        Text.assemble(("world ", "dim"), str(state.world_size), *_rejoining(state)),
        Text.assemble(("hosts ", "dim"), str(len(state.hosts))),
    ]
    if state.checkpoint_step is not None:
        copied = state.checkpoint_copied
        fields.append(
            Text.assemble(
                ("checkpoint ", "dim"),
                f"step {state.checkpoint_step}",
                *([(f" (copy: step {copied})", "dim")] if copied is not None else []),
            )
        )
    if state.exit_code is not None:
        code = (str(state.exit_code), "red" if state.exit_code else "green")
        fields.append(Text.assemble(("exit code ", "dim"), code))
    status = Fields(fields)
    lines: list[RenderableType] = [ident, status]
    if (progress := progress_line(state, now, format_duration)) is not None:
        lines.append(progress)
    detail = state.detail
    if state.phase is Phase.STOPPING and state.stop_reason:
        detail = f"stopping: {state.stop_reason}"
    if detail:
        text = Text(no_wrap=True, overflow="ellipsis")
        if marker:
            text.append(f"{marker} ", style="cyan")
        text.append(clean_line(detail), style="italic")
        lines.append(text)
    return Group(*lines)


def select_ranks(ranks: Sequence[RankState], limit: int | None) -> tuple[RankState, ...]:
    """At most ``limit`` ranks in rank order, failed ranks first to be kept."""
    if limit is None or len(ranks) <= limit:
        return tuple(ranks)
    failed = [r for r in ranks if r.status is RankStatus.FAILED][:limit]
    chosen = {r.rank for r in failed}
    for r in ranks:
        if len(chosen) >= limit:
            break
        chosen.add(r.rank)
    return tuple(r for r in ranks if r.rank in chosen)


def mesh_labels(ranks: Sequence[RankState], mesh: MeshLayout) -> Mapping[int, str]:
    """Each worker's place in ``mesh`` (:meth:`MeshLayout.label`) by global rank: the
    ``i``-th worker by global rank is mesh worker ``i``; parameter servers have none."""
    workers = worker_ranks((r.rank, r.role) for r in ranks)
    return {rank: mesh.label(i) for i, rank in enumerate(workers[: mesh.world])}


HOST_CHARS = 12
"""The most of a host's name the rank table shows (longer ones end with …), so that
the host column stays at 80 columns, where a rank moved to another host shows it."""


def rank_table(
    ranks: Sequence[RankState],
    *,
    last_line: bool = True,
    max_rows: int | None = None,
    mesh: MeshLayout | None = None,
    legend: bool = False,
    seen: dict[str, int] | None = None,
) -> RenderableType:
    """One row per rank, its columns chosen for the width it is drawn at
    (:class:`~dmlctl.ui.rank_table.RankTable`): rank, state, step, loss, samples/s,
    then the host (abbreviated: :data:`HOST_CHARS`), the worker's place in the device
    mesh (with ``mesh``), the strategy's own columns and the role where roles differ (a
    server's row), then epoch, comm/step, comm % and GPU memory, then the last line.

    With ``max_rows`` and more ranks than that, failed ranks are kept first and the
    caption says how many rows were left out. The last-line column never wraps.
    With ``legend``, a dim line under the table says what each shown strategy column
    means (:data:`~dmlctl.ui.metric_columns.STRATEGY_COLUMNS`). ``seen``: the live
    view's memory of each column's widest (:attr:`RankTable.seen`).
    """
    shown = select_ranks(ranks, max_rows)
    mixed = len({r.role for r in ranks}) > 1  # a server's row needs its label
    columns = [
        Column("host", lambda r: Text(truncate(r.host, HOST_CHARS)), 1, "left"),
        Column("rank", lambda r: Text(str(r.rank), style=rank_style(r.rank)), 0),
        Column("role", lambda r: Text(r.role), 1 if mixed else 3, "left"),
    ]
    if mesh is not None:
        labels = mesh_labels(ranks, mesh)
        columns.append(Column("mesh", lambda r: Text(labels.get(r.rank, MISSING)), 1, "left"))
    columns += [
        Column("state", status_text, 0, "left"),
        Column("step", lambda r: Text(format_step(r.step)), 0),
        Column("loss", lambda r: Text(format_loss(r.loss)), 0),
        Column("samples/s", lambda r: Text(compact_rate(r.samples_per_s)), 0),
    ]
    if any("epoch" in r.metrics for r in ranks):
        columns.append(Column("epoch", epoch_cell, 2))
    columns += [
        Column(
            STRATEGY_COLUMNS[key].header,
            STRATEGY_COLUMNS[key].cell,
            2 if key in COMMON else 1,
            meaning=STRATEGY_COLUMNS[key].meaning,
        )
        for key in strategy_columns(ranks)
    ]
    more = len(ranks) - len(shown)
    return RankTable(
        shown,
        columns,
        (lambda r: Text(truncate(clean_line(r.last_line), LAST_LINE_CHARS))) if last_line else None,
        f"… {more} more ranks not shown" if more else None,
        legend,
        seen,
    )


def root_cause_panel(cause: Failure, *, max_lines: int = 15) -> Panel:
    """Red panel: the headline, then the last ``max_lines`` traceback lines verbatim."""
    body = Text()
    body.append(cause.headline(), style="bold red")
    lines = [ln for chunk in cause.traceback for ln in chunk.splitlines() if ln.strip()]
    if len(lines) > max_lines:
        body.append(f"\n… {len(lines) - max_lines} earlier traceback lines", style="dim")
        lines = lines[-max_lines:]
    for ln in lines:
        body.append("\n")
        body.append(clean_line(ln))
    return Panel(body, title="root cause", title_align="left", border_style="red")
