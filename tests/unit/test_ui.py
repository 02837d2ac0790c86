"""Rendering tests for dmlctl.ui: render to a fixed-width capture console, assert text."""

from __future__ import annotations

import dataclasses
import io
import time

from rich.console import Console, RenderableType

from dmlctl.failure import Kind, named
from dmlctl.runs.events import (
    AgentExited,
    AgentStarted,
    Event,
    Finished,
    LogLines,
    MetricRecord,
    Prepared,
    Progress,
    RankExited,
    RankStarted,
    Restarting,
    Stream,
)
from dmlctl.runs.reducer import apply
from dmlctl.runs.state import Phase, RankStatus, RunState, new_run_state
from dmlctl.text import clean_line
from dmlctl.ui import (
    LiveDashboard,
    PlainPrinter,
    render_dashboard,
    render_run_detail,
    render_run_list,
    render_summary,
)
from dmlctl.ui.format import format_duration, format_loss, truncate

T0 = 1_700_000_000.0
HOSTS = {0: "host-a", 1: "host-a", 2: "host-b", 3: "host-b"}
CAUSE = named(
    host="host-a",
    rank=1,
    exc_type="ValueError",
    message="bad batch shape (3, 7)",
    traceback=(
        "Traceback (most recent call last):",
        '  File "train.py", line 42, in <module>',
        "    loss = step(batch)",
        '  File "train.py", line 17, in step',
        "    raise ValueError('bad batch shape (3, 7)')",
        "ValueError: bad batch shape (3, 7)",
    ),
)


def render(renderable: RenderableType, width: int = 140) -> str:
    console = Console(
        record=True, width=width, force_terminal=False, color_system=None, file=io.StringIO()
    )
    console.print(renderable)
    return console.export_text()


def fresh() -> RunState:
    return new_run_state(
        "r-20240101-abcd",
        "mnist",
        "allreduce",
        [(r, h, "worker") for r, h in HOSTS.items()],
        created_at=T0,
    )


def running() -> RunState:
    events: list[Event] = [Progress("starting torchrun on host-a, host-b", T0 + 1)]
    events += [AgentStarted(h, 100 + i, T0 + 1) for i, h in enumerate(("host-a", "host-b"))]
    events += [RankStarted(h, r, r % 2, "worker", 1000 + r, T0 + 2) for r, h in HOSTS.items()]
    events += [Prepared(h, r, "allreduce", T0 + 2) for r, h in HOSTS.items()]
    for r, h in HOSTS.items():
        events.append(LogLines(h, r, Stream.STDOUT, (f"epoch 1 rank {r} ready",), T0 + 3))
        events.append(
            MetricRecord(
                h, r, 120 + r, {"loss": 0.123456789 * (r + 1), "samples_per_s": 812.25}, T0 + 4
            )
        )
    events.append(
        LogLines("host-b", None, Stream.AGENT, ("torchrun: rendezvous complete",), T0 + 4)
    )
    return apply(fresh(), events)


def failed() -> RunState:
    return apply(
        running(),
        [
            LogLines("host-a", 1, Stream.STDERR, ("ValueError: bad batch shape (3, 7)",), T0 + 5),
            RankExited("host-a", 1, 1, CAUSE, T0 + 5),
            AgentExited("host-a", 1, ("torchrun failed",), T0 + 6),
            AgentExited("host-b", 1, (), T0 + 6),
            Finished(T0 + 65),
        ],
    )


def test_dashboard_has_header_and_one_row_per_rank() -> None:
    out = render(render_dashboard(running(), T0 + 3725))
    assert "r-20240101-abcd" in out and "mnist" in out and "allreduce" in out
    assert "running" in out and "1:02:05" in out and "world 4" in out
    rows = [ln for ln in out.splitlines() if ln.lstrip().startswith(("host-a", "host-b"))]
    assert len(rows) == 4
    for r, h in HOSTS.items():
        row = next(ln for ln in rows if f"epoch 1 rank {r} ready" in ln)
        assert row.lstrip().startswith(h) and str(120 + r) in row and "812.2" in row
    assert "0.1235" in out and "0.4938" in out  # 4 significant digits


def test_dashboard_shows_progress_detail_with_spinner_while_starting() -> None:
    state = apply(fresh(), [Progress("starting torchrun on local…", T0)])
    assert state.phase is Phase.STARTING
    out = render(render_dashboard(state, T0 + 1))
    line = next(ln for ln in out.splitlines() if "starting torchrun on local…" in ln)
    assert line.split()[0] in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
    assert render(render_dashboard(state, T0 + 1)) == out  # pure: same input, same view


def test_dashboard_root_cause_panel_and_tail_prefixes() -> None:
    out = render(render_dashboard(failed(), T0 + 100))
    assert "root cause" in out
    assert "rank 1 on host-a: ValueError: bad batch shape (3, 7)" in out
    assert 'File "train.py", line 17, in step' in out
    assert "failed (1)" in out  # rank state with exit code
    assert "0:01:05" in out  # elapsed frozen at Finished
    assert "[rank 0] epoch 1 rank 0 ready" in out
    assert "[rank 1] ValueError: bad batch shape (3, 7)" in out
    assert "[host-b] torchrun: rendezvous complete" in out


def test_the_log_tail_marks_where_the_next_attempt_begins() -> None:
    before = dataclasses.replace(failed(), phase=Phase.RUNNING, ended_at=None)
    state = apply(
        before,
        [
            Restarting(1, CAUSE, 1.0, T0 + 66),
            LogLines("host-a", 0, Stream.STDOUT, ("epoch 1 again",), T0 + 70),
        ],
    )
    lines = render(render_dashboard(state, T0 + 71), width=100).splitlines()
    at = [i for i, line in enumerate(lines) if "── attempt 2 ──" in line]
    assert len(at) == 1, lines
    assert "ValueError: bad batch shape" in "\n".join(lines[: at[0]])
    assert "[rank 0] epoch 1 again" in lines[at[0] + 1], lines


def test_a_script_that_never_calls_prepare_shows_strategy_none_once_it_trains() -> None:
    """A plain torchrun script (a Trainer's, Lightning's): the job's strategy never
    wraps its model, so the header says none as soon as it is known, and at the end."""
    events: list[Event] = [
        RankStarted(h, r, r % 2, "worker", 1000 + r, T0) for r, h in HOSTS.items()
    ]
    starting = apply(fresh(), events)
    assert starting.strategy_label() == "allreduce"  # not known yet
    stepping = apply(starting, [MetricRecord("host-a", 0, 1, {"loss": 1.0}, T0 + 1)])
    assert "strategy none" in render(render_dashboard(stepping, T0 + 2))
    failing = apply(starting, [RankExited("host-a", 1, 1, CAUSE, T0 + 1), Finished(T0 + 2)])
    assert (failing.phase, failing.strategy) == (Phase.FAILED, "none")


def test_long_lines_truncated_and_markup_shown_verbatim() -> None:
    long = "x" * 500 + " END"
    state = apply(
        running(),
        [
            LogLines("host-a", 0, Stream.STDOUT, (long,), T0 + 5),
            LogLines("host-a", 2, Stream.STDOUT, ("[red]not markup[/red]\x1b[31m!",), T0 + 5),
        ],
    )
    out = render(render_dashboard(state, T0 + 6), width=100)
    assert all(len(ln) <= 100 for ln in out.splitlines())
    assert "END" not in out and "…" in out
    assert "[red]not markup[/red]!" in out


HOSTILE = "title \x1b]0;owned\x07 c1 \x9b2J nul \x00 end"
"""An OSC terminal title, a C1 CSI (clear screen), a NUL: printed by a rank."""


def test_control_characters_from_a_rank_are_shown_escaped_never_sent() -> None:
    assert clean_line(HOSTILE) == "title \\x1b]0;owned\\x07 c1 \\x9b2J nul \\x00 end"
    assert clean_line("\x1b[31mred\x1b[0m \x1b[2Jok") == "red ok"  # CSI: dropped
    state = apply(running(), [LogLines("host-a", 0, Stream.STDOUT, (HOSTILE,), T0 + 5)])
    out = render(render_dashboard(state, T0 + 6), width=160)
    assert "\\x1b]0;owned\\x07" in out and "\\x9b2J" in out and "\\x00" in out
    assert not any(c in out for c in ("\x00", "\x07", "\x9b", "\x1b]")), repr(out)
    buf = io.StringIO()
    PlainPrinter(buf).on_events([LogLines("host-a", 0, Stream.STDOUT, (HOSTILE,), T0)], state)
    assert buf.getvalue().splitlines()[1] == "[rank 0] " + clean_line(HOSTILE)


def test_tail_limited_to_tail_lines() -> None:
    lines = [LogLines("host-a", 0, Stream.STDOUT, (f"line {i:03d}",), T0) for i in range(50)]
    out = render(render_dashboard(apply(running(), lines), T0, tail_lines=5))
    assert "line 049" in out and "line 045" in out and "line 044" not in out


def test_many_ranks_capped_with_failed_rank_kept() -> None:
    state = new_run_state("r", "j", "s", [(r, "h", "worker") for r in range(100)], T0)
    state = apply(state, [RankExited("h", 77, 3, None, T0)])
    out = render(render_dashboard(state, T0, max_rank_rows=10))
    assert "failed (3)" in out and "90 more ranks not shown" in out


def test_format_helpers() -> None:
    assert format_duration(0) == "0:00:00" and format_duration(36000 + 61) == "10:01:01"
    assert format_loss(None) == "-" and format_loss(1234567.0) == "1.235e+06"
    assert truncate("abcdef", 4) == "abc…" and truncate("abc", 4) == "abc"
    assert clean_line("10%\r50%\r100% done\r") == "100% done"


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_live_dashboard_refresh_is_rate_limited() -> None:
    clock = FakeClock()
    buf = io.StringIO()
    console = Console(file=buf, width=140, force_terminal=True, color_system=None)
    state = running()
    with LiveDashboard(console, max_fps=4, clock=clock, wall_clock=lambda: T0 + 10) as dash:
        for i in range(1000):
            clock.t = i * 0.0001  # 1000 updates within 0.1 fake seconds
            dash.update(state)
        assert 1 <= dash.frames <= 2
        clock.t = 0.3  # a frame is due again: the latest snapshot is drawn
        dash.update(failed())
        assert dash.frames <= 3
        dash.close(failed())
        frames = dash.frames
        dash.update(state)  # after close: no more drawing
        assert dash.frames == frames
    assert "root cause" in buf.getvalue()


def test_live_dashboard_update_is_cheap() -> None:
    console = Console(file=io.StringIO(), width=140, force_terminal=True)
    state = running()
    with LiveDashboard(console, clock=lambda: 0.0) as dash:
        start = time.perf_counter()
        for _ in range(100_000):
            dash.update(state)
        assert time.perf_counter() - start < 1.0
        assert dash.frames == 1


def test_plain_printer_lines_and_periodic_summary() -> None:
    clock = FakeClock()
    out = io.StringIO()
    printer = PlainPrinter(out, summary_interval=10.0, clock=clock)
    state = fresh()

    def feed(events: list[Event]) -> str:
        nonlocal state
        state = apply(state, events)
        start = out.tell()
        printer.on_events(events, state)
        return out.getvalue()[start:]

    text = feed(
        [
            Progress("starting torchrun on local", T0),
            RankStarted("host-a", 1, 1, "worker", 42, T0),
            LogLines("host-a", 1, Stream.STDOUT, ("hello",), T0),
            LogLines("host-a", None, Stream.AGENT, ("agent up",), T0),
            MetricRecord("host-a", 1, 5, {"loss": 0.5, "samples_per_s": 100.0}, T0),
        ]
    )
    assert text.splitlines() == [
        "dmlctl: run r-20240101-abcd (job mnist, strategy none)",  # first; no ctx.prepare
        "dmlctl: starting torchrun on local",
        "dmlctl: rank 1 started on host-a (worker, pid 42)",
        "[rank 1] hello",
        "[host-a] agent up",
    ]
    clock.t = 9.9
    assert "step" not in feed([MetricRecord("host-a", 1, 6, {"loss": 0.25}, T0)])
    clock.t = 10.0
    text = feed([LogLines("host-a", 1, Stream.STDOUT, ("tick",), T0)])
    assert "dmlctl: rank 1 step 6 loss 0.25 samples/s 100.0" in text
    assert "rank 0 step" not in text  # ranks without metrics are not summarised
    clock.t = 25.0
    assert "step" not in feed([LogLines("host-a", 1, Stream.STDOUT, ("tick",), T0)])  # unchanged
    text = feed([RankExited("host-a", 1, 1, CAUSE, T0)])
    assert "dmlctl: rank 1 on host-a exited with code 1: ValueError: bad batch" in text
    text = feed([Restarting(1, CAUSE, 1.5, T0)])  # why it restarts, whatever printed before
    assert text.startswith("dmlctl: rank 1 on host-a: ValueError: bad batch"), text
    assert text.rstrip().endswith(": restart 1 in 1.5 s"), text


def test_plain_printer_final_summary_on_finish() -> None:
    clock = FakeClock()
    out = io.StringIO()
    printer = PlainPrinter(out, clock=clock)
    events: list[Event] = [MetricRecord("host-b", 2, 9, {"loss": 1.0}, T0), Finished(T0 + 1)]
    state = apply(fresh(), events)
    printer.on_events(events, state)
    text = out.getvalue()
    assert text.rstrip().endswith("dmlctl: rank 2 step 9 loss 1 samples/s -")
    assert text.count("dmlctl: run ") == 1  # its id first; the outcome is the summary's


def test_summary_after_failure() -> None:
    out = render(render_summary(failed(), "runs/r-20240101-abcd"))
    assert "r-20240101-abcd failed in 0:01:05" in out and "exit code 1" in out
    assert "ValueError: bad batch shape (3, 7)" in out and "loss = step(batch)" in out
    assert "logs: runs/r-20240101-abcd/logs" in out
    for r in HOSTS:
        assert str(120 + r) in out
    assert "logs:" not in render(render_summary(failed(), None))


def test_the_final_line_says_what_the_outcome_took() -> None:
    done = dataclasses.replace(failed(), phase=Phase.SUCCEEDED, exit_code=0, root_cause=None)
    assert "after" not in render(render_summary(done, None)).splitlines()[0]
    took = dataclasses.replace(done, restarts=1, respawns=2)
    first = render(render_summary(took, None)).splitlines()[0]
    assert "succeeded in 0:01:05 after 1 restart and 2 ranks replaced in place" in first


def test_a_resume_is_no_restart_in_the_header_nor_in_the_final_line() -> None:
    """README: the resume itself spends no restart budget; the header says so too."""
    gone = dataclasses.replace(CAUSE, kind=Kind.CONTROLLER, exc_type="ControllerLost")
    state = apply(running(), [Restarting(1, gone, 0.0, T0 + 10)])
    assert (state.restarts, state.resumes, state.restarted) == (1, 1, 0)
    header = render(render_dashboard(state, T0 + 11))
    assert "restarts 0 (resumed 1×)" in header, header
    done = dataclasses.replace(state, phase=Phase.SUCCEEDED, exit_code=0, ended_at=T0 + 65)
    assert "after 1 resume" in render(render_summary(done, None)).splitlines()[0]


def test_a_rank_stopped_by_its_peers_failure_is_shown_so() -> None:
    """Rank 0's collective broke because rank 1 failed: not a failure of its own."""
    broken = named(
        "host-b", 0, "RuntimeError", "Connection closed by peer [10.0.0.2]:4242", (), T0 + 5
    )
    assert broken.collateral
    for order in ([0, 1], [1, 0]):  # whichever end is seen first
        exits = {
            0: RankExited("host-b", 0, 1, broken, T0 + 5),
            1: RankExited("host-a", 1, 1, CAUSE, T0 + 5),
        }
        state = apply(running(), [exits[r] for r in order])
        ranks = {r.rank: r for r in state.ranks}
        assert ranks[0].status is RankStatus.STOPPED and ranks[0].peer_failed, order
        assert ranks[1].status is RankStatus.FAILED and state.root_cause is not None
        out = render(render_dashboard(state, T0 + 6), width=160)
        assert "stopped (peer failed)" in out and "failed (1)" in out


def test_a_parameter_server_is_shown_serving() -> None:
    from dmlctl.runs.events import Heartbeat

    state = apply(running(), [Heartbeat("host-b", 3, 5, T0 + 5, stage="serving")])
    assert "serving" in render(render_dashboard(state, T0 + 6), width=160)


def test_the_detail_says_why_each_attempt_failed() -> None:
    from dmlctl.ui.summary import render_run_detail

    state = apply(running(), [Restarting(1, dataclasses.replace(CAUSE, ts=T0 + 5), 1.0, T0 + 5)])
    out = render(render_run_detail(state, T0 + 70))
    (line,) = [x for x in out.splitlines() if x.startswith("attempt ")]
    assert line.startswith("attempt 1 failed at ") and line.endswith(
        ": rank 1 on host-a: ValueError: bad batch shape (3, 7)"
    ), line


def test_run_list_and_detail() -> None:
    ok = apply(
        running(), [RankExited(HOSTS[r], r, 0, None, T0 + 7) for r in HOSTS] + [Finished(T0 + 8)]
    )
    out = render(render_run_list([running(), ok, failed()], T0 + 3600))
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(T0))
    lines = [ln for ln in out.splitlines() if "r-20240101-abcd" in ln]
    assert len(lines) == 3
    assert "running" in lines[0] and "0/4" in lines[0] and "1:00:00" in lines[0]
    assert "succeeded" in lines[1] and "4/4" in lines[1] and "0:00:08" in lines[1]
    assert "failed" in lines[2] and started in lines[2]
    assert "no runs yet" in render(render_run_list([], T0))

    # A 128-character job name squeezes nothing; at 80 columns what does not fit is
    # left out (job, ranks, strategy; started shortened), never cut to "…".
    long = new_run_state(
        "a" * 24 + "-20240101-120000-abcd", "a" * 128, "easgd-async", [(0, "h", "worker")], T0
    )
    for width in (80, 160):
        shown = render(render_run_list([long, ok], T0 + 60, width), width)
        rows = [ln for ln in shown.splitlines() if "-2024010" in ln]
        assert len(rows) == 2 and all(len(ln) <= width for ln in shown.splitlines()), shown
        assert "a" * 24 + "-20240101-120000-abcd" in rows[0], shown
        assert "pending" in rows[0] and "0:01:00" in rows[0], shown
        assert "succeeded" in rows[1] and "0:00:08" in rows[1], shown
        assert "…" not in shown.replace("a" * 23 + "…", ""), shown
    assert "easgd-async" in shown and "4/4" in shown and "a" * 23 + "…" in shown  # 160

    detail = render(render_run_detail(failed(), T0 + 100))
    assert "r-20240101-abcd" in detail and started in detail
    assert sum(ln.lstrip().startswith(("host-a", "host-b")) for ln in detail.splitlines()) == 4
    assert "root cause" in detail and "ValueError: bad batch shape (3, 7)" in detail


def test_strategy_metrics_get_their_own_columns() -> None:
    from dmlctl.runs.events import MetricRecord
    from dmlctl.runs.reducer import apply
    from dmlctl.runs.state import new_run_state
    from dmlctl.ui.format import rank_table

    state = new_run_state("r", "job", "bmuf", [(0, "a", "worker"), (1, "a", "worker")], 0.0)
    values = {
        "loss": 0.5,
        "comm_bytes_per_step": 3 * 1024 * 1024,
        "comm_share": 0.25,
        "consensus": 0.0123,
    }
    state = apply(state, [MetricRecord("a", 0, 10, values, 1.0)])
    console = Console(record=True, width=160, color_system=None)
    console.print(rank_table(state.ranks))
    text = console.export_text()
    assert "comm/step" in text and "comm %" in text and "consensus" in text
    assert "3.0 MiB" in text and "25%" in text and "0.0123" in text
    assert "primal res" not in text  # only what some rank reported
    plain = Console(record=True, width=160, color_system=None)
    plain.print(rank_table(new_run_state("r", "j", "ssgd", [(0, "a", "worker")], 0.0).ranks))
    assert "comm/step" not in plain.export_text()


def test_header_shows_the_newest_checkpoint_and_its_copy() -> None:
    from dmlctl.runs.events import CheckpointCopied, CheckpointSaved, Resized

    state = apply(running(), [CheckpointSaved("host-a", 0, 10, "/c/step-10", T0 + 5)])
    assert "checkpoint step 10" in render(render_dashboard(state, T0 + 6))
    state = apply(state, [CheckpointCopied(10, T0 + 6)])
    assert "checkpoint step 10 (copy: step 10)" in render(render_dashboard(state, T0 + 7))
    resized = apply(
        state,
        [
            Resized(
                ((0, "host-b", "worker"), (1, "host-b", "worker")), "next attempt on host-b", T0 + 8
            )
        ],
    )
    assert (resized.world_size, resized.hosts) == (2, ("host-b",))
    assert [r.host for r in resized.ranks] == ["host-b", "host-b"]
    assert RunState.from_dict(resized.to_dict()) == resized


def test_a_gpu_worker_shows_its_allocated_and_reserved_gpu_memory_and_a_cpu_run_no_column() -> None:
    from dataclasses import replace

    from dmlctl.ui.format import rank_table

    state = new_run_state("r", "j", "ssgd", [(0, "a", "worker"), (1, "a", "server")], 0.0)
    gpu, server = state.ranks
    gpu = replace(gpu, metrics={"gpu_mem_bytes": 1.5 * 2**30, "gpu_reserved_bytes": 2 * 2**30})
    text = render(rank_table([gpu, server]), width=160)
    assert "GPU mem" in text
    assert "1.5 GiB/2.0 GiB" in text and "-/-" in text  # the server: on the CPU
    assert "GPU mem" not in render(rank_table(state.ranks), width=160)


def test_a_rank_starting_up_shows_what_it_does_until_its_first_step() -> None:
    """Not a row of dashes for the seconds before the first step: the state column
    says importing, joining or first step (the heartbeat's stage)."""
    from dmlctl.runs.events import Heartbeat

    state = apply(
        new_run_state(
            "r-20240101-abcd", "job", "ssgd", [(0, "h", "worker"), (1, "h", "worker")], T0
        ),
        [RankStarted("h", r, r, "worker", 100 + r, T0 + 1) for r in (0, 1)]
        + [
            Heartbeat("h", 0, 0, T0 + 2, stage="importing"),
            Heartbeat("h", 1, 0, T0 + 2, stage="joining"),
        ],
    )
    rows = render(render_dashboard(state, T0 + 3), 100).splitlines()
    assert any(line.split()[:5] == ["h", "0", "worker", "importing", "-"] for line in rows), rows
    assert any(line.split()[:5] == ["h", "1", "worker", "joining", "-"] for line in rows), rows
    state = apply(
        state,
        [
            Heartbeat("h", 0, 0, T0 + 4, stage="first step"),
            Heartbeat("h", 1, 3, T0 + 4),  # stepped: no stage any more
            MetricRecord("h", 1, 3, {"loss": 0.5}, T0 + 4),
        ],
    )
    assert (state.ranks[0].stage, state.ranks[1].stage) == ("first step", None)
    rows = render(render_dashboard(state, T0 + 5), 100).splitlines()
    assert any(line.split()[3:6] == ["first", "step", "-"] for line in rows), rows
    assert any(line.split()[:5] == ["h", "1", "worker", "running", "3"] for line in rows), rows
