"""``dmlctl bench straggler``: the other workers' throughput next to a slowed worker.

For each scenario (:data:`SCENARIOS`) two ordinary dmlctl runs (run directory, logs,
``dmlctl status``) of ``straggler_job/train.py`` on this machine, restarts off: a
baseline where every worker sleeps ``step_sleep`` per step, and one where the last
worker sleeps :data:`FACTOR` times as long. The claim measured: under ``asgd``, under
``ssp`` while the straggler stays within ``s`` steps, and under ``sync-ps`` with one
backup worker, the fast workers keep ≥ 0.8× of their baseline steps/s; under ``ssgd``
they drop to the straggler's pace.
Definitions are in :mod:`dmlctl.bench.straggler_report`. This module never imports
torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from dmlctl.bench.plan import announce, planned
from dmlctl.bench.ps import local_bench_cluster
from dmlctl.bench.runs import (
    NO_RESTARTS,
    BenchFailed,
    BenchInterrupted,
    BenchPartial,
    Launcher,
    interrupted_after,
    launch_bench,
    metric_lines,
)
from dmlctl.bench.straggler_report import (
    Scenario,
    ScenarioResult,
    compare,
    median_rates,
    parse_rates,
)
from dmlctl.errors import UsageError
from dmlctl.launch.api import launch
from dmlctl.spec.models import ClusterSpec, JobSpec, StrategySpec
from dmlctl.text import plural

JOB_DIR = Path(__file__).resolve().parent / "straggler_job"
"""The job's workdir (shipped to the hosts)."""

WORKER_SCRIPT = "train.py"
FACTOR = 3.0
"""How many times longer the straggler sleeps per step (the issue's 3×)."""

MIN_STEPS = 20  # above the default burst's end and above every default s
MAX_STEP_SLEEP = 1.0

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("ssgd", "ssgd"),
        Scenario("asgd", "asgd", servers=1, absorbs=True),
        Scenario("ssp-s3", "ssp", {"staleness": 3}, servers=1),
        # 5 steps at 3× fall 5·(3 − 1) = 10 steps behind: within s = 12.
        Scenario(
            "ssp-s12-burst", "ssp", {"staleness": 12}, servers=1, burst=(10, 15), absorbs=True
        ),
        # Synchronous SGD whose rounds close on K − 1 = 2 gradients: the late one drops.
        Scenario("sync-ps-b1", "sync-ps", {"backup_workers": 1}, servers=1, absorbs=True),
    )
}
"""The scenarios by name, in report order."""

__all__ = ["FACTOR", "SCENARIOS", "BenchFailed", "parse_scenarios", "run_straggler_bench"]


def parse_scenarios(text: str) -> list[Scenario]:
    """Comma-separated scenario names (``all``: every one) in the order given.

    Raises :class:`UsageError` naming the valid names for an unknown or empty one.
    """
    names = [n.strip() for n in text.split(",")]
    if names == ["all"]:
        return list(SCENARIOS.values())
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise UsageError(
            f"unknown scenario(s) {', '.join(repr(n) for n in unknown)}; "
            f"valid: all, {', '.join(SCENARIOS)}"
        )
    return [SCENARIOS[n] for n in dict.fromkeys(names)]


def check_options(steps: int, step_sleep: float, repeats: int) -> None:
    """Raise :class:`UsageError` for ``steps < MIN_STEPS``, a ``step_sleep`` outside
    ``(0, MAX_STEP_SLEEP]`` or ``repeats < 1``."""
    if steps < MIN_STEPS:
        raise UsageError(f"--steps must be at least {MIN_STEPS}, got {steps}")
    if not 0 < step_sleep <= MAX_STEP_SLEEP:
        raise UsageError(f"--step-sleep must be in (0, {MAX_STEP_SLEEP:g}] s, got {step_sleep}")
    if repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {repeats}")


def straggler_job(scenario: Scenario, *, steps: int, step_sleep: float, slowed: bool) -> JobSpec:
    """The job spec of one run of ``scenario`` (no I/O): the baseline, or with the last
    worker ``FACTOR``× slower (on the scenario's burst only, if it has one). No
    restarts: a restarted attempt would mix two measurements."""
    args = ["--steps", str(steps), "--step-sleep", str(step_sleep)]
    if slowed:
        args += ["--factor", str(FACTOR)]
        if scenario.burst is not None:
            args += ["--burst", f"{scenario.burst[0]}:{scenario.burst[1]}"]
    return JobSpec(
        name=f"bench-straggler-{scenario.name}",
        script=WORKER_SCRIPT,
        args=args,
        workers=scenario.workers,
        parameter_servers=scenario.servers,
        workdir=str(JOB_DIR),
        strategy=StrategySpec.model_validate(
            {"name": scenario.strategy, "params": dict(scenario.params)}
        ),
        env={"OMP_NUM_THREADS": "1"},
        restart=NO_RESTARTS,
    )


def _run_once(
    launcher: Launcher, job: JobSpec, cluster: ClusterSpec, console: Console, home: Path | None
) -> tuple[dict[int, float], int | None, str]:
    """Launch ``job`` to its end; its per-worker steps/s, straggler and run id."""
    result = launch_bench(job, cluster, console=console, home=home, launcher=launcher)
    rates, straggler = parse_rates(metric_lines(result))
    return rates, straggler, result.run_id


STARTUP_S = 4.0
"""About what a run takes besides its steps (launch, start-up, exit) on 2 cores."""


def plan(scenarios: Sequence[Scenario], steps: int, step_sleep: float, repeats: int) -> str:
    """The runs :func:`run_straggler_bench` makes, and about how long they take (a
    baseline run lasts its steps, a straggler run the straggler's, :data:`FACTOR` ×)."""
    each = STARTUP_S + steps * step_sleep * (1 + FACTOR) / 2
    why = f"{plural(len(scenarios), 'scenario')} × {repeats} × baseline and straggler"
    return planned(len(scenarios) * repeats * 2, why, each)


def run_straggler_bench(
    scenarios: Sequence[Scenario],
    *,
    steps: int,
    step_sleep: float,
    repeats: int,
    console: Console,
    cluster: ClusterSpec,
    home: Path | None = None,
    launcher: Launcher = launch,
) -> tuple[list[ScenarioResult], list[str]]:
    """Run every scenario (baseline, then straggler, ``repeats`` times) on ``cluster``
    (the default local one is widened to fit workers + servers); return one result per
    scenario and the run ids, in order.

    Blocks until the last run ends. Raises :class:`UsageError` for bad options (before
    launching) and :class:`BenchFailed` naming the run when one fails or reports no
    rate for some worker; a Ctrl-C after the first scenario ended raises
    :class:`BenchPartial` with the scenarios done (and their run ids).
    ``launcher`` runs each job (tests pass a fake).
    """
    check_options(steps, step_sleep, repeats)
    announce(console, "straggler", plan(scenarios, steps, step_sleep, repeats))
    results: list[ScenarioResult] = []
    run_ids: list[str] = []
    for scenario in scenarios:
        where = local_bench_cluster(cluster, scenario.workers + scenario.servers)
        shape = (steps, step_sleep, repeats)
        try:
            results.append(_scenario(scenario, shape, where, console, home, launcher, run_ids))
        except BenchInterrupted:
            if not results:
                raise
            note = interrupted_after(len(run_ids), len(scenarios) * repeats * 2)
            raise BenchPartial(note, (results, run_ids[: len(results) * repeats * 2])) from None
    return results, run_ids


def _scenario(
    scenario: Scenario,
    shape: tuple[int, float, int],
    where: ClusterSpec,
    console: Console,
    home: Path | None,
    launcher: Launcher,
    run_ids: list[str],
) -> ScenarioResult:
    """One scenario's runs (baseline, then straggler, ``repeats`` times; each run's id
    appended to ``run_ids`` as it ends) and its result."""
    steps, step_sleep, repeats = shape
    runs: dict[bool, list[dict[int, float]]] = {False: [], True: []}
    straggler: int | None = None
    for repeat in range(1, repeats + 1):
        for slowed in (False, True):
            label = "straggler" if slowed else "baseline"
            console.print(f"[dim]{scenario.name} {label} {repeat}/{repeats}[/dim]", highlight=False)
            job = straggler_job(scenario, steps=steps, step_sleep=step_sleep, slowed=slowed)
            rates, flagged, run_id = _run_once(launcher, job, where, console, home)
            run_ids.append(run_id)
            if len(rates) != scenario.workers:
                raise BenchFailed(
                    f"benchmark run {run_id} succeeded but reported steps/s for "
                    f"{len(rates)} of {scenario.workers} workers; see `dmlctl logs {run_id}`"
                )
            runs[slowed].append(rates)
            straggler = flagged if slowed else straggler
    baseline, with_straggler = median_rates(runs[False]), median_rates(runs[True])
    try:
        return compare(scenario, baseline, with_straggler, straggler, steps=steps)
    except ValueError as exc:
        raise BenchFailed(f"{exc} (runs {', '.join(run_ids[-2 * repeats :])})") from None
