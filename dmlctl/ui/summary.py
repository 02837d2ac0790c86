"""Static views of a run: the end-of-run summary and the ``dmlctl status`` pages.

All functions are pure renderers over :class:`RunState` snapshots (read back from
``state.json`` by the caller); they share their pieces with the live dashboard
through :mod:`dmlctl.ui.format`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from dmlctl.runs.state import RankStatus, Replacement, RunState
from dmlctl.text import clean_line, plural
from dmlctl.ui.format import (
    format_duration,
    phase_text,
    rank_table,
    root_cause_panel,
    run_header,
)

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def format_local_time(ts: float) -> str:
    """``YYYY-MM-DD HH:MM:SS`` of the epoch timestamp ``ts`` in the local time zone."""
    return time.strftime(TIME_FORMAT, time.localtime(ts))


def _log_hint(run_dir: str | None) -> Text | None:
    if run_dir is None:
        return None
    return Text.assemble(("logs: ", "dim"), f"{run_dir.rstrip('/')}/logs")


def render_summary(state: RunState, run_dir: str | None, *, ranks: bool = True) -> RenderableType:
    """What is printed when a run ends (after the dashboard is released).

    One line with the run id, final phase, elapsed time and exit code; the stop
    reason if the user stopped it; every rank's final step, loss and status; the
    root cause with its traceback tail; and ``logs: <run_dir>/logs`` when
    ``run_dir`` is given (``ranks=False`` leaves out the per-rank table). Elapsed
    time is ``ended_at - created_at`` (the run is expected to have ended; if not, it
    counts up to ``started_at`` or zero).
    """
    end = state.ended_at if state.ended_at is not None else (state.started_at or state.created_at)
    line = Text.assemble(
        ("run ", "dim"),
        (state.run_id, "bold"),
        " ",
        phase_text(state.phase),
        (" in ", "dim"),
        format_duration(state.elapsed(end)),
        *_recoveries(state),
    )
    if state.exit_code is not None:
        line.append("  exit code ", style="dim")
        line.append(str(state.exit_code), style="red" if state.exit_code else "green")
    parts: list[RenderableType] = [line]
    if state.stop_reason:
        parts.append(Text.assemble(("stopped: ", "yellow"), state.stop_reason))
    if ranks and state.ranks:
        parts.append(rank_table(state.ranks, last_line=False, mesh=state.mesh))
    if state.root_cause is not None:
        parts.append(root_cause_panel(state.root_cause))
    hint = _log_hint(run_dir)
    if hint is not None:
        parts.append(hint)
    return Group(*parts)


def _recoveries(state: RunState) -> list[tuple[str, str]]:
    """`` after 1 restart and 2 ranks replaced in place``: what the outcome took."""
    said = [plural(state.restarted, "restart")] if state.restarted else []
    said += [f"{plural(state.respawns, 'rank')} replaced in place"] if state.respawns else []
    said += [f"{plural(state.resumes, 'resume')}"] if state.resumes else []
    return [(" after ", "dim"), (" and ".join(said), "yellow")] if said else []


JOB_WIDTH = 24
"""The most a job name takes in ``dmlctl status`` (longer ones end with …: the run id
starts with the name too), so one long name never squeezes the other columns."""
SHORT_TIME_FORMAT = "%m-%d %H:%M"
#: What ``dmlctl status`` leaves out, in this order, where the terminal is too narrow
#: for every column (``started`` is first shortened to ``MM-DD HH:MM``): never the
#: run id, the state or the duration.
_OPTIONAL = ("job", "ranks", "strategy", "started")


def _run_rows(states: Sequence[RunState], now: float, short: bool) -> list[dict[str, Text]]:
    """Each run's cells by column name."""
    rows = []
    for st in states:
        done = sum(1 for r in st.ranks if r.status is RankStatus.SUCCEEDED)
        started = time.strftime(SHORT_TIME_FORMAT, time.localtime(st.created_at))
        rows.append(
            {
                "run id": Text(st.run_id),
                "job": Text(st.job),
                "strategy": Text(st.strategy),
                "state": phase_text(st.phase),
                "ranks": Text(f"{done}/{st.world_size}"),
                "started": Text(started if short else format_local_time(st.created_at)),
                "duration": Text(format_duration(st.elapsed(now))),
            }
        )
    return rows


def _fitting(rows: list[dict[str, Text]], width: int | None) -> list[str]:
    """The columns shown in ``width`` characters (all of them with ``width`` None)."""
    widths = {
        name: min(max(len(name), *(r[name].cell_len for r in rows)), JOB_WIDTH)
        if name == "job"
        else max(len(name), *(r[name].cell_len for r in rows))
        for name in rows[0]
    }
    shown = list(widths)
    for name in _OPTIONAL:
        if width is None or sum(widths[c] for c in shown) + 2 * (len(shown) - 1) <= width:
            break
        shown.remove(name)
    return shown


def render_run_list(
    states: Sequence[RunState], now: float, width: int | None = None
) -> RenderableType:
    """The ``dmlctl status`` table, one row per run in the given order.

    Columns: run id, job, strategy, state (coloured phase), ranks (succeeded/total),
    started (local ``YYYY-MM-DD HH:MM:SS`` of the run's creation), duration
    (``H:MM:SS``; still counting at ``now`` for a run that has not ended). In a
    terminal ``width`` characters wide, the columns of :data:`_OPTIONAL` that do not
    fit are left out (``started`` shortened first), never squeezed.
    """
    if not states:
        return Text("no runs yet", style="dim")
    rows = _run_rows(states, now, short=False)
    shown = _fitting(rows, width)
    if "started" not in shown:
        rows = _run_rows(states, now, short=True)
        shown = _fitting(rows, width)
    table = Table(box=None, pad_edge=False, header_style="bold")
    right = {"ranks", "duration"}
    for name in shown:
        table.add_column(
            name,
            justify="right" if name in right else "left",
            no_wrap=True,
            overflow="ellipsis",
            max_width=JOB_WIDTH if name == "job" else None,
        )
    for row in rows:
        table.add_row(*(row[name] for name in shown))
    return table


def render_unreadable(run_id: str, reason: str) -> Text:
    """The ``dmlctl status`` line of a run whose state cannot be read."""
    return Text.assemble(("run ", "dim"), run_id, ": ", ("state unreadable", "red"), f" ({reason})")


def replacement_line(gap: Replacement) -> Text:
    """``rank 1 on local replaced in place at 2026-11-29 14:03:07 (killed by SIGKILL;
    …): back after 0.19 s, 34% through its data (epoch 1, its step 25)`` — its data
    position, where its script takes data through ``ctx.shard``; else ``at step 1554``
    (``not back yet`` while its replacement has not logged)."""
    back = f"back after {gap.gap_s:.2f} s, " if gap.gap_s is not None else "not back yet"
    if gap.gap_s is not None and gap.progress is not None:  # where its data went on
        epoch = f"epoch {gap.epoch}, " if gap.epoch is not None else ""
        back += f"{gap.progress:.0%} through its data ({epoch}its step {gap.step})"
    elif gap.gap_s is not None:
        back += f"at step {gap.step}"
    return Text.assemble(
        (f"rank {gap.rank} on {gap.host} replaced in place at ", "yellow"),
        format_local_time(gap.lost_at),
        (f" ({gap.cause}): {back}", "yellow"),
    )


def attempt_lines(state: RunState) -> list[Text]:
    """``attempt 1 failed at 2026-11-29 14:03:07: rank 1 on local: Signal: killed by
    SIGKILL`` for each attempt that failed (not the failures recovered in place: the
    ranks replaced have lines of their own, :func:`replacement_line`)."""
    ended = [failure for failure in state.failures if not failure.recovered]
    return [
        Text.assemble(
            (f"attempt {number} failed at ", "yellow"),
            format_local_time(failure.ts),
            (f": {clean_line(failure.headline())}", "yellow"),
        )
        for number, failure in enumerate(ended, start=1)
    ]


def dropped_lines(state: RunState) -> list[Text]:
    """``node-b lost at 2026-11-29 14:03:07 (AgentLost: …): rank 1 left out, the others
    went on`` for each host whose ranks were dropped in place (``restart.rejoin_wait``)."""
    dropped = [r for r in state.ranks if r.status is RankStatus.DROPPED]
    lines = []
    for failure in (f for f in state.failures if f.recovered and f.rank is None):
        ranks = [r.rank for r in dropped if r.host == failure.host]
        if not ranks:  # its ranks moved to another host (replacement_line)
            continue
        which = "rank" if len(ranks) == 1 else "ranks"
        lines.append(
            Text.assemble(
                (f"{failure.host} lost at ", "yellow"),
                format_local_time(failure.ts),
                (f" ({clean_line(failure.exc_type + ': ' + failure.message)}): ", "yellow"),
                (f"{which} {', '.join(map(str, ranks))} left out, the others went on", "yellow"),
            )
        )
    return lines


def render_run_detail(state: RunState, now: float) -> RenderableType:
    """``dmlctl status RUN_ID``: the dashboard header, when the run started, its device
    mesh (``device mesh: pp 2 × tp 2 (4 workers)``, with one), every rank (with its
    place in the mesh), the attempts that failed and why, the ranks replaced in place
    and how long each logged nothing, and the root cause."""
    parts: list[RenderableType] = [
        run_header(state, now),
        Text.assemble(("started ", "dim"), format_local_time(state.created_at)),
    ]
    if state.mesh is not None:
        parts.append(Text(state.mesh.describe()[0]))
    parts += [Text(""), rank_table(state.ranks, mesh=state.mesh)]
    parts += attempt_lines(state)
    parts += [replacement_line(gap) for gap in state.replacements]
    parts += dropped_lines(state)
    if state.root_cause is not None:
        parts.append(root_cause_panel(state.root_cause))
    return Group(*parts)
