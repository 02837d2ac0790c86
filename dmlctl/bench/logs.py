"""``dmlctl bench logs``: how many log lines per second dmlctl carries from the ranks
to the run directory, and what printing costs a training loop under dmlctl.

Both parts run ``logs_job/train.py`` (a plain script) as ordinary dmlctl jobs on this
machine, two ranks, without a live view:

* **carried** — each rank prints ``lines`` lines as fast as it can; the rate is every
  line of both ranks over the time from the first rank's first line to the end of the
  run (every line is then in ``logs/rank-N.log``, which is checked line by line);
* **slowdown** — a loop of ``steps`` iterations, each computing about ``work_us``
  microseconds (the same arithmetic in every run: calibrated once, here) and printing
  one line, timed inside the rank; once printing to stdout (through dmlctl) and once
  to /dev/null, alternating, ``repeats`` times each. The slowdown is
  ``median(stdout) / median(devnull) - 1``; the baseline runs in the same benchmark,
  under the same launcher, so only the printing differs.

Goals (see docs/benchmarks.md): at least 200,000 lines/s per host carried, and a
slowdown of at most 5 %.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dmlctl.bench.plan import announce, planned
from dmlctl.bench.runs import BenchFailed, Launcher, launch_bench
from dmlctl.errors import UsageError
from dmlctl.launch.api import launch
from dmlctl.spec import default_cluster
from dmlctl.spec.models import ClusterSpec, JobSpec, StrategySpec

JOB_DIR = Path(__file__).resolve().parent / "logs_job"
WORKERS = 2
GOAL_LINES_PER_S = 200_000
GOAL_SLOWDOWN = 0.05


def calibrate(work_us: float) -> int:
    """Iterations of the job's ``work`` loop that take about ``work_us`` µs here."""
    n, start = 200_000, time.perf_counter()
    x = 0.0
    for i in range(n):
        x += i * 0.5
    per_iteration = (time.perf_counter() - start) / n
    return max(1, int(work_us * 1e-6 / per_iteration))


def logs_job(name: str, out: Path, *args: str) -> JobSpec:
    """The benchmark script as a two-worker job writing its results into ``out``."""
    return JobSpec(
        name=name,
        script="train.py",
        workdir=str(JOB_DIR),
        workers=WORKERS,
        args=[*args, "--out", str(out)],
        strategy=StrategySpec(name="none"),
    )


def _results(out: Path) -> list[dict[str, float]]:
    found = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    if len(found) != WORKERS:
        raise BenchFailed(f"the benchmark ranks wrote {len(found)} of {WORKERS} result files")
    return found


def _count_lines(run_dir: Path | None, expected: int) -> None:
    """Raise unless every rank's log holds ``expected`` lines, the last one included."""
    for rank in range(WORKERS):
        path = (run_dir or Path("/nonexistent")) / "logs" / f"rank-{rank}.log"
        with open(path, "rb") as f:
            count = sum(1 for _ in f)
        if count != expected:
            raise BenchFailed(f"{path}: {count} lines, the rank printed {expected}")


def carried(
    lines: int, cluster: ClusterSpec, *, console: Console, home: Path, launcher: Launcher
) -> dict[str, Any]:
    """Lines per second carried for ``lines`` lines per rank (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="dmlctl-bench-logs-") as tmp:
        job = logs_job("bench-logs-flood", Path(tmp), "--mode", "flood", "--lines", str(lines))
        result = launch_bench(job, cluster, console=console, home=home, launcher=launcher)
        ended = time.time()
        first = min(r["start"] for r in _results(Path(tmp)))
    _count_lines(result.run_dir, lines)
    seconds = max(ended - first, 1e-9)
    return {
        "lines": WORKERS * lines,
        "seconds": seconds,
        "lines_per_s": WORKERS * lines / seconds,
        "run_id": result.run_id,
    }


def slowdown(
    steps: int,
    work_us: float,
    repeats: int,
    cluster: ClusterSpec,
    *,
    console: Console,
    home: Path,
    launcher: Launcher,
) -> dict[str, Any]:
    """The printing loop against the silent one (see the module docstring)."""
    times: dict[str, list[float]] = {"stdout": [], "devnull": []}
    iters = calibrate(work_us)
    for round_ in range(repeats):
        for sink in times:
            console.print(f"[dim]loop printing to {sink}, {round_ + 1}/{repeats}[/dim]")
            with tempfile.TemporaryDirectory(prefix="dmlctl-bench-logs-") as tmp:
                job = logs_job(
                    f"bench-logs-{sink}",
                    Path(tmp),
                    "--mode",
                    "loop",
                    "--lines",
                    str(steps),
                    "--work-iters",
                    str(iters),
                    "--sink",
                    sink,
                )
                launch_bench(job, cluster, console=console, home=home, launcher=launcher)
                times[sink].append(max(r["loop_s"] for r in _results(Path(tmp))))
    printing, silent = statistics.median(times["stdout"]), statistics.median(times["devnull"])
    return {
        "steps": steps,
        "work_us": work_us,
        "work_iters": iters,
        "repeats": repeats,
        "stdout_s": times["stdout"],
        "devnull_s": times["devnull"],
        "slowdown": printing / silent - 1,
    }


STARTUP_S = 8.0
"""About what a run takes besides its lines (launch, start-up, exit) on 2 cores."""
CARRIED_PER_S = 200_000
"""About the lines per second the flood run carries, both ranks together, on 2 cores."""


def plan(lines: int, steps: int, work_us: float, repeats: int) -> str:
    """The runs :func:`run_logs_bench` makes, and about how long they take: the flood
    of ``lines`` per rank, then the printing and the silent loop ``repeats`` times."""
    total = STARTUP_S + WORKERS * lines / CARRIED_PER_S
    total += 2 * repeats * (STARTUP_S + steps * work_us / 1e6)
    count = 1 + 2 * repeats
    return planned(count, f"1 flood + {repeats} × 2 loops", total / count)


def run_logs_bench(
    *,
    lines: int = 1_000_000,
    steps: int = 20_000,
    work_us: float = 1000.0,
    repeats: int = 3,
    console: Console,
    home: Path | None = None,
    cluster: ClusterSpec | None = None,
    launcher: Launcher = launch,
) -> dict[str, Any]:
    """Both measurements; raises :class:`UsageError` for bad sizes and
    :class:`BenchFailed` when a run fails or a line is missing."""
    if lines < 1000 or steps < 100 or work_us < 0 or repeats < 1:
        raise UsageError("need --lines >= 1000, --steps >= 100, --work-us >= 0, --repeats >= 1")
    announce(console, "logs", plan(lines, steps, work_us, repeats))
    cluster = cluster if cluster is not None else default_cluster()
    with tempfile.TemporaryDirectory(prefix="dmlctl-bench-home-") as tmp:
        where = home if home is not None else Path(tmp)
        console.print(f"[dim]carrying {WORKERS} × {lines:,} lines…[/dim]")
        flood = carried(lines, cluster, console=console, home=where, launcher=launcher)
        loop = slowdown(
            steps, work_us, repeats, cluster, console=console, home=where, launcher=launcher
        )
    return {
        "carried": flood,
        "loop": loop,
        "goal_lines_per_s": GOAL_LINES_PER_S,
        "goal_slowdown": GOAL_SLOWDOWN,
    }


def render_logs_table(report: dict[str, Any]) -> Table:
    """One row per measurement: the figure, the goal, and whether it is met."""
    flood, loop = report["carried"], report["loop"]
    table = Table(
        title="log lines through dmlctl (one host, 2 ranks)",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for name in ("measure", "value", "goal", ""):
        table.add_column(name, justify="left" if name == "measure" else "right")
    rate, ok_rate = flood["lines_per_s"], flood["lines_per_s"] >= report["goal_lines_per_s"]
    table.add_row(
        f"lines/s carried ({flood['lines']:,} lines)",
        f"{rate:,.0f}",
        f">= {report['goal_lines_per_s']:,}",
        "ok" if ok_rate else "MISSED",
    )
    slow, ok_slow = loop["slowdown"], loop["slowdown"] <= report["goal_slowdown"]
    table.add_row(
        f"loop slowdown printing vs /dev/null ({loop['steps']:,} steps of "
        f"{loop['work_us']:g} µs, median of {loop['repeats']})",
        f"{slow * 100:+.1f} %",
        f"<= {report['goal_slowdown'] * 100:.0f} %",
        "ok" if ok_slow else "MISSED",
    )
    return table
