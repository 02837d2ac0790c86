"""``dmlctl bench hangs``: does the hang detector leave healthy runs alone and name a
real hang's rank and line in time? Measured on this machine while a second process
keeps a core busy, with the job's default ``restart`` settings unless told otherwise.

Every run is an ordinary dmlctl job of ``hang_job/train.py`` (two workers, SGD with
momentum, ssgd) with one scenario (see that script):

* healthy — ``prep``, ``gil``, ``starved``, ``compile``, ``eval``: a stretch of
  ``seconds`` without steps (``skew`` more on rank 1, while rank 0 waits for it in a
  collective; in ``gil`` rank 1 cannot even beat meanwhile, and in ``starved`` it
  cannot beat while 30 busy processes share its core). A *false verdict* is a run in which any
  rank was reported hung.
* hangs — ``deadlock`` (rank 1 blocks forever outside the collective rank 0 waits
  in) and ``sigstop`` (rank 1 stops itself). The *delay* is from the moment rank 1
  printed that it hangs to the hang's root cause; *named* counts runs whose root cause
  is rank 1 and, for the deadlock, the line it blocks on (``in wait_for_batch``).

Goals: no false verdict; every hang named, within ``hang_timeout + 2`` seconds.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dmlctl.bench.plan import announce
from dmlctl.bench.runs import (
    NO_RESTARTS,
    BenchInterrupted,
    Launcher,
    interrupted_after,
    launch_bench,
)
from dmlctl.errors import UsageError
from dmlctl.failure import Kind
from dmlctl.launch.api import launch
from dmlctl.spec import default_cluster
from dmlctl.spec.models import ClusterSpec, JobSpec
from dmlctl.spec.restart import RestartSpec
from dmlctl.ui.format import format_duration

JOB_DIR = Path(__file__).resolve().parent / "hang_job"
HEALTHY = ("prep", "gil", "starved", "compile", "eval")
HANGS = ("deadlock", "sigstop")
SCENARIOS = HEALTHY + HANGS
_HANG_LINE = re.compile(r"^HANG (\d+\.\d+) (\S+)$", re.M)


@dataclass
class Outcome:
    """What the runs of one scenario showed."""

    scenario: str
    runs: int = 0
    hung: int = 0  # runs with a hang verdict (false ones for a healthy scenario)
    named: int = 0  # hangs whose root cause names rank 1 (and the line, for deadlock)
    delays: list[float] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "runs": self.runs,
            "hung": self.hung,
            "named": self.named,
            "delays_s": self.delays,
            "run_ids": self.run_ids,
        }


def hang_job(scenario: str, *, seconds: float, skew: float, hang_timeout: float | None) -> JobSpec:
    """Two workers running ``scenario`` (``hang_timeout`` None: the job default)."""
    restart = NO_RESTARTS
    if hang_timeout is not None:
        restart = restart.model_copy(update={"hang_timeout": hang_timeout})
    return JobSpec(
        name=f"bench-hang-{scenario}",
        script="train.py",
        workdir=str(JOB_DIR),
        workers=2,
        args=["--scenario", scenario, "--seconds", f"{seconds:g}", "--skew", f"{skew:g}"],
        restart=restart,
    )


def _judge(outcome: Outcome, run_dir: Path, state: Any) -> None:
    """Count one finished run into ``outcome``."""
    causes = [*state.failures, *([state.root_cause] if state.root_cause else [])]
    hangs = [c for c in causes if c.kind is Kind.HANG]
    outcome.runs += 1
    outcome.run_ids.append(state.run_id)
    if not hangs:
        return
    outcome.hung += 1
    if outcome.scenario in HEALTHY:
        return
    log = (run_dir / "logs" / "rank-1.log").read_text(encoding="utf-8", errors="replace")
    found = _HANG_LINE.search(log)
    cause = hangs[0]
    if found is None:
        return
    outcome.delays.append(cause.ts - float(found.group(1)))
    line_ok = (
        outcome.scenario != "deadlock" or f"{found.group(2)} in wait_for_batch" in cause.message
    )
    outcome.named += int(cause.rank == 1 and line_ok)


STARTUP_S = 10.0
"""About what one run takes besides its scenario (start-up, teardown): the estimate."""


def planned(runs: int, scenarios: Sequence[str], stretch: float, timeout: float) -> str:
    """``12 runs (6 scenarios × 2) of about 1 min each: about 0:12:00`` — a healthy
    run lasts its stretch, a hang its timeout, each plus :data:`STARTUP_S`."""
    each = [(stretch if s in HEALTHY else timeout) + STARTUP_S for s in scenarios]
    count, kinds = runs * len(scenarios), len(scenarios)
    return (
        f"{count} run{'s' * (count != 1)} ({kinds} scenario{'s' * (kinds != 1)} × {runs}) of about "
        f"{sum(each) / len(each):.0f} s each: about {format_duration(runs * sum(each))}; "
        "Ctrl-C ends the bench with what it has"
    )


def _run_all(
    outcomes: list[Outcome],
    runs: int,
    where: Path,
    cluster: ClusterSpec,
    console: Console,
    launcher: Launcher,
    shape: tuple[float, float, float | None],
) -> int:
    """Run every scenario ``runs`` times, judging each run; the number of runs done,
    short of all of them when one was interrupted (Ctrl-C, SIGTERM: the bench ends
    there instead of going on with the next one)."""
    seconds, skew, hang_timeout = shape
    done = 0
    for i in range(runs):
        for outcome in outcomes:
            console.print(f"[dim]{outcome.scenario} {i + 1}/{runs}[/dim]")
            job = hang_job(outcome.scenario, seconds=seconds, skew=skew, hang_timeout=hang_timeout)
            try:
                result = launch_bench(
                    job, cluster, console=console, home=where, launcher=launcher, check=False
                )
            except BenchInterrupted:
                return done
            if result.state is not None and result.run_dir is not None:
                _judge(outcome, result.run_dir, result.state)
            done += 1
    return done


def run_hang_bench(
    *,
    runs: int = 20,
    scenarios: Sequence[str] = SCENARIOS,
    seconds: float = 35.0,
    skew: float = 32.0,
    hang_timeout: float | None = None,
    burn: bool = True,
    console: Console,
    home: Path | None = None,
    cluster: ClusterSpec | None = None,
    launcher: Launcher = launch,
) -> dict[str, Any]:
    """Run every scenario ``runs`` times (first saying how many runs and about how
    long); the report has one :class:`Outcome` dict per scenario, the settings, the
    goal delay and, when a run was interrupted, ``partial`` (the runs done until then;
    the bench stops there). Raises :class:`UsageError` for bad settings."""
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios:
        raise UsageError(
            f"unknown scenario(s) {', '.join(unknown) or '(none)'}; valid: {', '.join(SCENARIOS)}"
        )
    if runs < 1 or seconds <= 0 or skew < 0:
        raise UsageError("need --runs >= 1, --seconds > 0 and --skew >= 0")
    timeout = hang_timeout if hang_timeout is not None else RestartSpec().hang_timeout
    cluster = cluster if cluster is not None else default_cluster()
    announce(console, "hangs", planned(runs, scenarios, seconds + skew, timeout))
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if burn else None
    outcomes = [Outcome(s) for s in scenarios]
    try:
        with tempfile.TemporaryDirectory(prefix="dmlctl-bench-hangs-") as tmp:
            where = home if home is not None else Path(tmp)
            shape = (seconds, skew, hang_timeout)
            done = _run_all(outcomes, runs, where, cluster, console, launcher, shape)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    total = runs * len(outcomes)
    return {
        **({"partial": interrupted_after(done, total)} if done < total else {}),
        "runs": runs,
        "seconds": seconds,
        "skew": skew,
        "hang_timeout": timeout,
        "burn": burn,
        "goal_delay_s": timeout + 2,
        "scenarios": [o.to_dict() for o in outcomes],
    }


def render_hang_table(report: dict[str, Any]) -> Table:
    """One row per scenario: false verdicts, or hangs named and their delays."""
    table = Table(
        title=f"hang detector, hang_timeout {report['hang_timeout']:g} s, "
        f"{'one core kept busy' if report['burn'] else 'idle machine'}",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for name in ("scenario", "runs", "verdicts", "named", "delay median", "delay max", "goal"):
        table.add_column(name, justify="left" if name == "scenario" else "right")
    for s in report["scenarios"]:
        delays = s["delays_s"]
        if s["scenario"] in HEALTHY:
            goal = "ok" if s["hung"] == 0 else "MISSED"
            table.add_row(s["scenario"], str(s["runs"]), f"{s['hung']} false", "-", "-", "-", goal)
            continue
        worst = max(delays) if delays else float("inf")
        met = s["named"] == s["runs"] and worst <= report["goal_delay_s"]
        table.add_row(
            s["scenario"],
            str(s["runs"]),
            str(s["hung"]),
            f"{s['named']}/{s['runs']}",
            f"{statistics.median(delays):.1f} s" if delays else "-",
            f"{worst:.1f} s" if delays else "-",
            "ok" if met else "MISSED",
        )
    return table
