"""``dmlctl bench recovery``: how long a run takes to train again after a worker dies.

Both sides run the same ``recovery_job/train.py`` (2 workers, gloo, DDP on a tiny
model, its own checkpoint every :data:`CHECKPOINT_EVERY` steps; see the script) for
:data:`STEPS` steps. On the first attempt, rank :data:`KILL_RANK` records the time
and SIGKILLs itself right after step :data:`KILL_AT`:

* **dmlctl** — a real run through :func:`dmlctl.launch.api.launch` with
  ``restart: {max_infra_restarts: 1, backoff_initial: <backoff>}`` and no
  ``checkpoint:`` block (the script's own checkpoints, as on the other side). The
  controller sees an infrastructure failure and starts a new attempt: the host's
  warm standby agent (started 5 s into every attempt, torchrun already imported)
  forks a new torchrun, which forms a new rendezvous.
* **torchrun** — ``python -m torch.distributed.run --standalone --nproc-per-node 2
  --max-restarts 1 train.py …``, which restarts its worker group in place, in the
  launch benchmark's environment plus :data:`TORCHRUN_ENV`:
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` because with torch's default (workers
  share the rendezvous TCPStore across restarts) a restarted gloo group can read the
  dead worker's address from the previous round and fail with "Connection refused"
  (pytorch/pytorch#135712; 2 of 4 restarts failed so with torch 2.13 here).
  ``TORCH_LOGS_OUT`` copies torchrun's log lines to a file, for the stages below.

**Recovery** = the time the killed rank completed its first step after the
restart − the time it recorded just before killing itself (both ``time.time()`` on
this machine). **Steps lost** = the last step any rank completed before the kill −
the step the restart resumed from (goal: at most the checkpoint interval).

Runs alternate (dmlctl, torchrun, dmlctl, …). There is no warm-up run: the first
attempt of every run imports and warms everything before the kill. Each
:class:`Recovery` also holds when each stage of the recovery ended (:data:`STAGES`,
seconds after the kill), read from the script's timing file, torchrun's log lines
and, for dmlctl, the run directory. This module never imports torch; run
directories go to a temporary ``DMLCTL_HOME``.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from dmlctl.bench.launch_overhead import summarize, time_once
from dmlctl.bench.plan import announce, planned
from dmlctl.bench.proc import bench_env, torchrun_argv
from dmlctl.bench.recovery_in_place import STRATEGY as IN_PLACE_STRATEGY
from dmlctl.bench.recovery_in_place import run_in_place
from dmlctl.bench.recovery_timing import (
    JOB_DIR,
    KILL_RANK,
    STAGES,
    STEP_SLEEP_S,
    Recovery,
    RecoveryBenchFailed,
    dmlctl_times,
    local_cluster,
    measure_recovery,
    read_timing_dir,
    script_argv,
    torchrun_times,
)
from dmlctl.bench.runs import BenchPartial, alternate, launch_bench
from dmlctl.errors import UsageError
from dmlctl.failure import Kind
from dmlctl.spec import ClusterSpec, JobSpec
from dmlctl.spec.ranks import RanksSpec
from dmlctl.spec.restart import RestartSpec
from dmlctl.text import plural

SCRIPT = "train.py"
JOB_NAME = "bench-recovery"
WORKERS = 2
STEPS = 150
CHECKPOINT_EVERY = 5
KILL_AT = 122  # ≈6 s into training: a failure strikes a run that has been going a while
DEFAULT_REPEATS = 3
DEFAULT_BACKOFF_S = 0.1
RATIO_GOAL = 1.2
SIDES = ("dmlctl", "torchrun")
IN_PLACE = "in_place"
"""The side of ``--mode in_place`` (:mod:`dmlctl.bench.recovery_in_place`)."""
IN_PLACE_GOALS = {"fresh": 0.5, "warm": 0.3}
"""in_place ÷ torchrun (kill → the killed rank's first step), per ``ranks.start``."""
RANK_STARTS = tuple(IN_PLACE_GOALS)
SURVIVOR_GOAL = 0.8  # the other workers' steps/s after the kill ÷ before
MODES = ("full", IN_PLACE)
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}
"""Environment of the bare torchrun side (see the module docstring)."""


@dataclass(frozen=True)
class RecoveryReport:
    """Every measured recovery of every side, and what they were measured under.

    ``runs`` maps each of :data:`SIDES` (and :data:`IN_PLACE` for ``--mode
    in_place``) to its recoveries, in run order (at least one each).
    """

    runs: Mapping[str, tuple[Recovery, ...]]
    backoff_s: float
    in_place_strategy: str = IN_PLACE_STRATEGY
    hosts: str = "this machine"  # where dmlctl's runs went (torchrun's: this machine)
    ranks_start: str = "fresh"  # how dmlctl's ranks started (the jobs' ranks.start)
    workers: int = WORKERS
    steps: int = STEPS
    checkpoint_every: int = CHECKPOINT_EVERY
    kill_at: int = KILL_AT
    kill_rank: int = KILL_RANK

    def median(self, side: str) -> float:
        """Median recovery seconds of ``side``."""
        return statistics.median(r.seconds for r in self.runs[side])

    @property
    def ratio(self) -> float:
        """median(dmlctl) / median(torchrun); the goal is at most :data:`RATIO_GOAL`."""
        return self.median("dmlctl") / self.median("torchrun")

    @property
    def in_place_ratio(self) -> float | None:
        """median(in_place) / median(torchrun) (goal: at most :attr:`in_place_goal`);
        None without the in-place side."""
        return self.median(IN_PLACE) / self.median("torchrun") if IN_PLACE in self.runs else None

    @property
    def in_place_goal(self) -> float:
        """The goal of :attr:`in_place_ratio` for ranks started as :attr:`ranks_start`."""
        return IN_PLACE_GOALS[self.ranks_start]

    @property
    def survivor_rate(self) -> float | None:
        """The median over the in-place runs of the other worker's steps/s after the
        kill ÷ before (goal: at least :data:`SURVIVOR_GOAL`); None without them."""
        rates = [r.survivor_rate for r in self.runs.get(IN_PLACE, ()) if r.survivor_rate]
        return statistics.median(rates) if rates else None

    def steps_lost(self, side: str) -> int:
        """The most steps ``side`` lost in one failure."""
        return max(r.steps_lost for r in self.runs[side])

    def stages(self, side: str) -> dict[str, float]:
        """Per stage of :data:`STAGES` (in that order): the median seconds after the
        kill over the runs of ``side`` in which it was seen (torchrun logs no
        ``detected`` line when no other worker is left to signal)."""
        seen = {k: [r.stages[k] for r in self.runs[side] if k in r.stages] for k, _ in STAGES}
        return {k: statistics.median(v) for k, v in seen.items() if v}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready report: settings, ``ratio``, and per side ``recovery_s``
        (median/min/max/samples), ``steps_lost`` (max), ``stages_s`` (medians), ``runs``."""
        sides = {
            side: {
                "recovery_s": summarize([r.seconds for r in runs]),
                "steps_lost": self.steps_lost(side),
                "stages_s": self.stages(side),
                "runs": [r.to_dict() for r in runs],
            }
            for side, runs in self.runs.items()
        }
        return {
            "workers": self.workers,
            "steps": self.steps,
            "checkpoint_every": self.checkpoint_every,
            "kill_at": self.kill_at,
            "kill_rank": self.kill_rank,
            "repeats": len(self.runs["dmlctl"]),
            "ranks_start": self.ranks_start,
            "backoff_s": self.backoff_s,
            "default_backoff_s": RestartSpec().backoff_initial,
            "ratio": self.ratio,
            "ratio_goal": RATIO_GOAL,
            **self._in_place_dict(),
            **sides,
        }

    def _in_place_dict(self) -> dict[str, Any]:
        if IN_PLACE not in self.runs:
            return {"mode": "full"}
        return {
            "mode": IN_PLACE,
            "hosts": self.hosts,
            "in_place_strategy": self.in_place_strategy,
            "in_place_ratio": self.in_place_ratio,
            "in_place_ratio_goal": self.in_place_goal,
            "survivor_rate": self.survivor_rate,
            "survivor_rate_goal": SURVIVOR_GOAL,
        }


def script_args(work: Path) -> list[str]:
    """Arguments of ``train.py`` for one run whose files go under ``work``."""
    options = {
        "--timing-dir": work / "timing",
        "--ckpt-dir": work / "ckpt",
        "--steps": STEPS,
        "--every": CHECKPOINT_EVERY,
        "--kill-at": KILL_AT,
        "--kill-rank": KILL_RANK,
        "--sleep": STEP_SLEEP_S,
    }
    return script_argv(options)


def recovery_job(work: Path, backoff: float, ranks: str = "fresh") -> JobSpec:
    """The dmlctl side's job: no ``checkpoint:`` block; one restart after exactly
    ``backoff`` seconds (``backoff_max`` raised to it if needed) for an infra failure
    (the SIGKILL) and, as torchrun's ``--max-restarts 1`` does, for a user one too:
    dmlctl sometimes blames the peer's collateral exit code instead (see
    :func:`run_dmlctl`)."""
    cap = max(backoff, RestartSpec().backoff_max)
    return JobSpec(
        name=JOB_NAME,
        script=SCRIPT,
        args=script_args(work),
        workers=WORKERS,
        workdir=str(JOB_DIR),
        restart=RestartSpec(
            max_infra_restarts=1, max_user_restarts=1, backoff_initial=backoff, backoff_max=cap
        ),
        ranks=RanksSpec.model_validate({"start": ranks}),
    )


def torchrun_command(work: Path) -> list[str]:
    """argv of the bare torchrun side: the launch benchmark's, with one restart."""
    return torchrun_argv(WORKERS, JOB_DIR / SCRIPT, script_args(work), max_restarts=1)


def bench_cluster() -> ClusterSpec:
    """This machine as host ``local`` with :data:`WORKERS` slots, whatever its cores."""
    return local_cluster(WORKERS)


def run_dmlctl(
    work: Path,
    *,
    backoff: float,
    home: Path,
    console: Console,
    cluster: ClusterSpec | None = None,
    ranks: str = "fresh",
) -> Recovery:
    """One dmlctl run of :func:`recovery_job` (its ranks started as ``ranks``) on
    ``cluster`` (default :func:`bench_cluster`); its recovery,
    whose ``cause`` is the failure dmlctl recorded. When that is not rank
    :data:`KILL_RANK`'s SIGKILL (torchrun's summary can name the peer that died of
    the broken connection first, or torchrun can fail on a half-written error file),
    a warning goes to ``console``. Raises :class:`RecoveryBenchFailed` unless the run
    succeeded after exactly one restart."""
    job = recovery_job(work, backoff, ranks)
    on = cluster or bench_cluster()
    result = launch_bench(job, on, console=console, home=home, check=False)
    state, run_dir = result.state, result.run_dir
    if state is None or run_dir is None or result.exit_code != 0 or state.restarts != 1:
        root = state.root_cause if state is not None else None
        why = root.headline() if root is not None else f"exit code {result.exit_code}"
        restarts = state.restarts if state is not None else 0
        raise RecoveryBenchFailed(
            f"dmlctl run {result.run_id} did not recover: {why}, {plural(restarts, 'restart')}"
        )
    cause = state.failures[0]
    if (cause.rank, cause.kind) != (KILL_RANK, Kind.KILLED):
        console.print(
            f"[yellow]dmlctl run {result.run_id} recorded the SIGKILL of rank "
            f"{KILL_RANK} as: {cause.headline()}[/yellow]",
            highlight=False,
        )
    times = dmlctl_times(run_dir)
    found = measure_recovery(read_timing_dir(work / "timing"), launcher_times=times)
    return dataclasses.replace(found, cause=cause.headline())


def run_torchrun(work: Path, home: Path) -> Recovery:
    """One bare torchrun run (:func:`torchrun_command`) in ``work``, in the launch
    benchmark's environment plus :data:`TORCHRUN_ENV`; its recovery. torchrun's own
    log lines also go to ``work/torchrun.log`` (``TORCH_LOGS_OUT``). Raises
    :class:`~dmlctl.bench.launch_overhead.LaunchBenchFailed` if it fails or times out."""
    log = work / "torchrun.log"
    env = bench_env(home, **TORCHRUN_ENV, TORCH_LOGS_OUT=str(log))
    time_once(torchrun_command(work), env, work)
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.exists() else []
    times = torchrun_times(lines)
    return measure_recovery(read_timing_dir(work / "timing"), launcher_times=times)


RUN_S = 15.0
"""About one timed failure and recovery, by either launcher, on 2 cores."""


IN_PLACE_RUN_S = 28.0
"""One in-place run: about 10 s of training on either side of the kill."""


def sides(mode: str) -> tuple[str, ...]:
    """The sides ``mode`` measures (raises :class:`UsageError` for an unknown one)."""
    if mode not in MODES:
        raise UsageError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    return SIDES if mode == "full" else (*SIDES, IN_PLACE)


def plan(repeats: int, mode: str = "full") -> str:
    """The runs :func:`run_recovery_bench` makes, and about how long they take."""
    count = len(sides(mode))
    each = (RUN_S * len(SIDES) + (IN_PLACE_RUN_S if mode == IN_PLACE else 0.0)) / count
    return planned(count * repeats, f"{repeats} × {count} launchers", each)


def run_recovery_bench(
    repeats: int = DEFAULT_REPEATS,
    *,
    backoff: float = DEFAULT_BACKOFF_S,
    mode: str = "full",
    strategy: str = IN_PLACE_STRATEGY,
    console: Console,
    home: Path | None = None,
    cluster: ClusterSpec | None = None,
    ranks: str = "fresh",
    measure: Callable[[str, Path], Recovery] | None = None,
) -> RecoveryReport:
    """Run every side of ``mode`` (:func:`sides`) ``repeats`` times, alternating
    (dmlctl first), and report.

    Each run gets a fresh directory (timing files, checkpoint) under a temporary
    directory; dmlctl's run directories go to ``home`` (default: a temporary
    ``DMLCTL_HOME``). dmlctl's runs go to ``cluster`` (default: this machine), whose
    hosts must see this machine's files (the lab's do: the scripts write their timing
    there); bare torchrun runs here. dmlctl's ranks start as ``ranks`` (``fresh`` or
    ``warm``: the jobs' ``ranks.start``). ``measure(side, work_dir)`` replaces the real
    runs in tests.
    Raises :class:`UsageError` for ``repeats < 1``, ``backoff <= 0``, another mode or
    another ``ranks``,
    :class:`RecoveryBenchFailed` if any run fails, and, for a Ctrl-C after a whole
    round, :class:`BenchPartial` with the report of the whole rounds.
    """
    if repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {repeats}")
    if not 0 < backoff < float("inf"):
        raise UsageError(f"--backoff must be a positive number of seconds, got {backoff}")
    if ranks not in RANK_STARTS:
        raise UsageError(f"--ranks must be one of {', '.join(RANK_STARTS)}, got {ranks!r}")
    measured = sides(mode)
    announce(console, "recovery", plan(repeats, mode))
    with tempfile.TemporaryDirectory(prefix="dmlctl-bench-recovery-") as tmp:
        dml_home = home if home is not None else Path(tmp) / "home"
        real = _real_runs(dml_home, backoff, strategy, ranks, console, cluster)

        def one(side: str, round_: int) -> Recovery:
            work = Path(tmp) / f"{side}-{round_}"
            work.mkdir()
            return (measure or real)(side, work)

        runs, note = alternate(measured, repeats, one, console)
    report = RecoveryReport(
        {side: tuple(r) for side, r in runs.items()},
        backoff_s=backoff,
        in_place_strategy=strategy,
        hosts="this machine" if cluster is None else plural(len(cluster.hosts), "host"),
        ranks_start=ranks,
    )
    if note is not None:
        raise BenchPartial(note, report)
    return report


def _real_runs(
    home: Path,
    backoff: float,
    strategy: str,
    ranks: str,
    console: Console,
    cluster: ClusterSpec | None,
) -> Callable[[str, Path], Recovery]:
    """``run(side, work_dir)``: one real run of ``side``, its recovery."""

    def run(side: str, work: Path) -> Recovery:
        if side == "dmlctl":
            return run_dmlctl(
                work, backoff=backoff, home=home, console=console, cluster=cluster, ranks=ranks
            )
        if side == IN_PLACE:
            return run_in_place(
                work, home=home, console=console, strategy=strategy, cluster=cluster, ranks=ranks
            )
        return run_torchrun(work, home)

    return run
