"""``dmlctl bench launch``: what ``dmlctl launch`` costs over bare torchrun.

Both sides run the same ``trivial/trivial.py`` (join a gloo group, one
all_reduce, leave) with the same number of local workers, as child processes of
this one, timed from spawn to exit with ``time.perf_counter``:

* **dmlctl** — ``python -m dmlctl launch trivial/job.yaml --workers N --ui quiet``
  (CLI start-up, spec loading, planning, run directory, host agent, torchrun,
  teardown: everything a user waits for);
* **torchrun** — ``python -m torch.distributed.run --standalone --nproc-per-node N
  trivial.py``.

Runs alternate (dmlctl, torchrun, dmlctl, …) after one untimed warm-up of each,
so drifting machine load hits both sides alike. The result reports median, min
and max per side and ``ratio = median(dmlctl) / median(torchrun)``. Run
directories go to a temporary ``DMLCTL_HOME`` (or ``home``) and never to the
user's.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dmlctl.agent.ask import IDLE_ENV
from dmlctl.bench.plan import announce, planned
from dmlctl.bench.proc import bench_env, run_checked, torchrun_argv
from dmlctl.bench.runs import BenchPartial, alternate
from dmlctl.errors import DmlctlError, UsageError
from dmlctl.text import plural

TRIVIAL_DIR = Path(__file__).resolve().parent / "trivial"
TRIVIAL_JOB = TRIVIAL_DIR / "job.yaml"
TRIVIAL_SCRIPT = TRIVIAL_DIR / "trivial.py"
MIN_REPEATS = 5
RUN_TIMEOUT_S = 300.0


class LaunchBenchFailed(DmlctlError):
    """One of the timed commands exited non-zero or timed out; carries its output tail."""


RANK_STARTS = ("fresh", "warm")


def dmlctl_command(workers: int, job: Path = TRIVIAL_JOB) -> list[str]:
    """argv of the dmlctl side."""
    return [
        sys.executable,
        "-m",
        "dmlctl",
        "launch",
        str(job),
        "--workers",
        str(workers),
        "--ui",
        "quiet",
    ]


def torchrun_command(workers: int) -> list[str]:
    """argv of the bare torchrun side."""
    return torchrun_argv(workers, TRIVIAL_SCRIPT)


def time_once(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> float:
    """Wall seconds ``argv`` takes to run to a successful end (:func:`run_checked`)."""
    start = time.perf_counter()
    run_checked(argv, env, cwd, timeout=RUN_TIMEOUT_S, error=LaunchBenchFailed)
    return time.perf_counter() - start


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """``{"median", "min", "max", "samples"}`` of wall times in seconds."""
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": list(samples),
    }


RUN_S = 3.2
"""About one launch of the trivial job, by either launcher, on 2 cores."""


def plan(repeats: int) -> str:
    """The runs :func:`run_launch_bench` makes, and about how long they take."""
    return planned(2 * (repeats + 1), f"{repeats} + a warm-up, × 2 launchers", RUN_S)


def job_file(start: str, where: Path) -> Path:
    """The trivial job with ``ranks: {start: START}`` (the shipped one for ``fresh``)."""
    if start not in RANK_STARTS:
        raise UsageError(f"--ranks must be one of {', '.join(RANK_STARTS)}, got {start!r}")
    if start == "fresh":
        return TRIVIAL_JOB
    job = where / "job.yaml"
    text = TRIVIAL_JOB.read_text() + f"workdir: {TRIVIAL_DIR}\nranks: {{start: {start}}}\n"
    job.write_text(text)
    return job


def run_launch_bench(
    repeats: int = MIN_REPEATS,
    workers: int = 2,
    *,
    console: Console,
    start: str = "fresh",
    server: bool = True,
    home: Path | None = None,
    timer: Callable[[Sequence[str], Mapping[str, str], Path], float] = time_once,
) -> dict[str, Any]:
    """Time both launchers ``repeats`` times each (alternating) and return the report.

    ``start``: the job's ``ranks.start`` on the dmlctl side (``fresh`` or ``warm``);
    ``server`` false: the dmlctl side runs without the agent server
    (``DMLCTL_AGENT_SERVER_IDLE=0``), as a first launch, or one on a host without one,
    does: its agent is a new process whose zygote imports torch.
    Report keys: ``repeats``, ``workers``, ``ranks_start``, ``dmlctl_s`` and ``torchrun_s`` (see
    :func:`summarize`), ``ratio`` and ``overhead_s`` (difference of medians).
    Raises :class:`UsageError` for ``repeats < 5`` or ``workers < 1``,
    :class:`LaunchBenchFailed` if any run fails, and, for a Ctrl-C after a whole timed
    round, :class:`BenchPartial` with the report of the whole rounds (``repeats`` is
    theirs). ``timer`` is injectable for tests.
    """
    if repeats < MIN_REPEATS:
        raise UsageError(f"--repeats must be at least {MIN_REPEATS} (medians of fewer are noise)")
    if workers < 1:
        raise UsageError(f"--workers must be >= 1, got {workers}")
    with tempfile.TemporaryDirectory(prefix="dmlctl-bench-launch-") as tmp:
        job = job_file(start, Path(tmp))
        announce(console, "launch", plan(repeats))
        sides = {"dmlctl": dmlctl_command(workers, job), "torchrun": torchrun_command(workers)}
        env = bench_env(home if home is not None else Path(tmp))
        envs = {"dmlctl": env if server else {**env, IDLE_ENV: "0"}, "torchrun": env}
        times, note = alternate(
            list(sides),
            repeats,
            lambda name, _: timer(sides[name], envs[name], Path(tmp)),
            console,
            warmup=True,
        )
    repeats = len(times["dmlctl"])
    dml, bare = summarize(times["dmlctl"]), summarize(times["torchrun"])
    report = {
        "repeats": repeats,
        "workers": workers,
        "ranks_start": start,
        "agent_server": server,
        "dmlctl_s": dml,
        "torchrun_s": bare,
        "ratio": dml["median"] / bare["median"],
        "overhead_s": dml["median"] - bare["median"],
        "commands": {name: " ".join(argv) for name, argv in sides.items()},
    }
    if note is not None:
        raise BenchPartial(note, {**report, "partial": note})
    return report


def render_launch_table(report: Mapping[str, Any]) -> Table:
    """Median / min / max seconds per launcher, and a last row with their ratios."""
    table = Table(
        title=(
            f"launch overhead, {plural(report['workers'], 'worker')}, ranks "
            f"{report.get('ranks_start', 'fresh')}"
            f"{'' if report.get('agent_server', True) else ', no agent server'}, "
            f"{report['repeats']} runs each"
        ),
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for name in ("launcher", "median (s)", "min (s)", "max (s)"):
        table.add_column(name, justify="left" if name == "launcher" else "right")
    for name in ("dmlctl", "torchrun"):
        s = report[f"{name}_s"]
        table.add_row(
            name,
            f"{s['median']:.3f}",
            f"{s['min']:.3f}",
            f"{s['max']:.3f}",
            end_section=name == "torchrun",
        )
    # The ratio of the medians alone: a ratio of the two minima (or maxima) is no bound
    # of it (it read as a max below the median).
    table.add_row("[bold]dmlctl/torchrun[/bold]", f"[bold]{report['ratio']:.3f}[/bold]", "", "")
    return table
