"""Results of the straggler benchmark: scenarios, definitions, parsing, rendering (pure).

Each scenario is one strategy run twice on the same ranks with the job script
``straggler_job/train.py``: once with every worker sleeping ``step_sleep`` per step
(*baseline*), once with the last worker sleeping ``factor`` times as long (*straggler*;
on every step, or only on the steps of a burst). Definitions:

* ``steps_per_s`` — one worker's steps divided by the wall time from just after a
  barrier before its loop to the end of its last ``opt.step()`` (the end-of-data
  synchronisation of the parameter-server strategies is not counted). With
  ``--repeats`` above 1: each worker's median over the repeats.
* *fast workers* — every worker but the straggler (the last worker).
* ``ratio`` — min over the fast workers of (steps/s with the straggler) / (their own
  steps/s in the baseline). :data:`GOAL`: ≥ 0.8 where the strategy should absorb the
  straggler (``asgd``; ``ssp`` while the straggler stays within ``s`` steps).
* ``straggler_pace`` — the straggler's steps/s with the slowdown / its steps/s in the
  baseline: for a persistent straggler a little above ``1/factor``, since only the
  sleep of a step is slowed, not its compute and communication.
* ``expected`` — where no goal applies, what synchronisation predicts for the fast
  workers from the measured ``straggler_pace``: under ``ssp`` with bound ``s``
  (``ssgd`` behaves as ``s = 0``) a fast worker ends its ``N`` steps when the
  straggler reaches ``N − s``, so the ratio is about ``pace · N / (N − s)`` (at most
  1): the straggler's pace plus ``s`` steps (``ssgd``: the straggler's pace).

Nothing here imports torch or does I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from dmlctl.bench.report import metric_values

GOAL = 0.8
"""Lowest ratio of the fast workers where the strategy should absorb the straggler."""

BENCH = "straggler"
"""Value of the ``bench`` key that marks a worker's record in ``metrics.jsonl``."""

RATE = "steps_per_s"
"""Key of a worker's measured rate in its record."""


@dataclass(frozen=True)
class Scenario:
    """One strategy setting of the benchmark (``params`` are the job's strategy params;
    ``burst``: the straggler is slow only on steps ``START <= step < END``)."""

    name: str
    strategy: str
    params: Mapping[str, Any] = field(default_factory=dict)
    workers: int = 3
    servers: int = 0
    burst: tuple[int, int] | None = None
    absorbs: bool = False
    """Whether the strategy should absorb this straggler: then :data:`GOAL` applies."""

    def params_text(self) -> str:
        """``params`` and the burst as ``k=v`` words (``-`` when there are none)."""
        words = [f"{k}={v}" for k, v in self.params.items()]
        if self.burst is not None:
            words.append(f"burst {self.burst[0]}:{self.burst[1]}")
        return ", ".join(words) or "-"

    def ranks_text(self) -> str:
        """``W`` workers, or ``W+S ps`` with parameter servers."""
        return f"{self.workers}+{self.servers} ps" if self.servers else str(self.workers)

    def staleness(self) -> int | None:
        """The bound ``s`` the fast workers are held to (``ssgd``: 0; ``asgd``: None)."""
        if self.strategy == "ssgd":
            return 0
        if self.strategy == "ssp":
            return int(self.params.get("staleness", 3))
        return None


def expected_ratio(scenario: Scenario, steps: int, pace: float) -> float | None:
    """The fast workers' ratio synchronisation predicts next to a persistent straggler
    running at ``pace`` × its baseline, under a staleness bound: ``pace · N / (N − s)``,
    at most 1. None where a goal applies instead, or without a bound."""
    s = scenario.staleness()
    if scenario.absorbs or s is None or scenario.burst is not None or steps <= s:
        return None
    return min(1.0, pace * steps / (steps - s))


def parse_rates(lines: Iterable[str]) -> tuple[dict[int, float], int | None]:
    """Per-worker ``steps_per_s`` and the straggler's worker rank from ``metrics.jsonl``
    lines (``{"values": {...}}`` or bare value objects). Only records with
    ``"bench": "straggler"`` and numeric ``worker``, ``straggler`` and ``steps_per_s``
    count; other ranks' records, blank, torn or foreign lines are skipped; for a
    repeated worker the last record wins."""
    rates: dict[int, float] = {}
    straggler: int | None = None
    for values in metric_values(lines):
        if values.get("bench") != BENCH:
            continue
        worker, slow, rate = values.get("worker"), values.get("straggler"), values.get(RATE)
        if not isinstance(rate, int | float) or not isinstance(worker, int):
            continue
        if not isinstance(slow, int):
            continue
        rates[worker] = float(rate)
        if slow:
            straggler = worker
    return rates, straggler


def median_rates(runs: Sequence[Mapping[int, float]]) -> dict[int, float]:
    """Each worker's median steps/s over ``runs`` (workers present in every run)."""
    if not runs:
        raise ValueError("no runs to combine")
    workers = set.intersection(*(set(r) for r in runs))
    return {w: statistics.median(r[w] for r in runs) for w in sorted(workers)}


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario's measured rates and what follows (see the module docstring)."""

    scenario: Scenario
    baseline: Mapping[int, float]
    slowed: Mapping[int, float]
    straggler: int
    steps: int

    @property
    def expected(self) -> float | None:
        """:func:`expected_ratio` at the measured :attr:`straggler_pace`."""
        return expected_ratio(self.scenario, self.steps, self.straggler_pace)

    @property
    def fast_ratios(self) -> dict[int, float]:
        """Per fast worker: steps/s with the straggler / steps/s in the baseline."""
        return {w: self.slowed[w] / self.baseline[w] for w in self.baseline if w != self.straggler}

    @property
    def ratio(self) -> float:
        """The smallest of :attr:`fast_ratios`."""
        return min(self.fast_ratios.values())

    @property
    def straggler_pace(self) -> float:
        """The straggler's steps/s with the slowdown / its own in the baseline."""
        return self.slowed[self.straggler] / self.baseline[self.straggler]

    @property
    def passed(self) -> bool | None:
        """Whether the ratio reaches :data:`GOAL`; None where no goal applies."""
        return self.ratio >= GOAL if self.scenario.absorbs else None

    def fast_rate(self, rates: Mapping[int, float]) -> float:
        """The slowest fast worker's steps/s in ``rates``."""
        return min(r for w, r in rates.items() if w != self.straggler)


def compare(
    scenario: Scenario,
    baseline: Mapping[int, float],
    slowed: Mapping[int, float],
    straggler: int | None,
    *,
    steps: int,
) -> ScenarioResult:
    """The result of ``scenario`` from both runs' per-worker steps/s.

    Raises :class:`ValueError` unless both runs report the same ``scenario.workers``
    workers with positive finite rates, and the straggler is one of them.
    """
    expected_workers = set(range(scenario.workers))
    for label, rates in (("baseline", baseline), ("straggler", slowed)):
        if set(rates) != expected_workers:
            raise ValueError(
                f"{scenario.name}: the {label} run reported workers {sorted(rates)}, "
                f"expected {sorted(expected_workers)}"
            )
        bad = [w for w, r in rates.items() if not (math.isfinite(r) and r > 0)]
        if bad:
            raise ValueError(f"{scenario.name}: the {label} run's rates of {bad} are not positive")
    if straggler not in expected_workers or scenario.workers < 2:
        raise ValueError(f"{scenario.name}: no straggler among two or more workers")
    return ScenarioResult(
        scenario=scenario,
        baseline=dict(baseline),
        slowed=dict(slowed),
        straggler=straggler,
        steps=steps,
    )


def goal_text(result: ScenarioResult) -> str:
    """The goal column: ``≥ 0.8``, or what synchronisation predicts (no pass/fail)."""
    s = result.scenario.staleness()
    if result.scenario.absorbs:
        return f"≥ {GOAL}"
    if result.expected is None:
        return "-"
    if s == 0:
        return f"≈ straggler pace ({result.expected:.2f})"
    return f"≈ straggler pace + s={s} steps ({result.expected:.2f})"


def straggler_json(
    results: Sequence[ScenarioResult],
    *,
    steps: int,
    step_sleep: float,
    factor: float,
    repeats: int,
    run_ids: Sequence[str] = (),
) -> dict[str, Any]:
    """The report as JSON-able data (rates keyed by worker rank as strings)."""
    return {
        "steps": steps,
        "step_sleep": step_sleep,
        "factor": factor,
        "repeats": repeats,
        "goal": GOAL,
        "run_ids": list(run_ids),
        "scenarios": [
            {
                "name": r.scenario.name,
                "strategy": r.scenario.strategy,
                "params": dict(r.scenario.params),
                "workers": r.scenario.workers,
                "servers": r.scenario.servers,
                "burst": list(r.scenario.burst) if r.scenario.burst else None,
                "straggler": r.straggler,
                "baseline_steps_per_s": {str(w): v for w, v in r.baseline.items()},
                "straggler_steps_per_s": {str(w): v for w, v in r.slowed.items()},
                "fast_ratios": {str(w): v for w, v in r.fast_ratios.items()},
                "ratio": r.ratio,
                "straggler_pace": r.straggler_pace,
                "goal": GOAL if r.scenario.absorbs else None,
                "expected": r.expected,
                "passed": r.passed,
            }
            for r in results
        ],
    }


def render_straggler_table(
    results: Sequence[ScenarioResult],
    *,
    steps: int,
    step_sleep: float,
    factor: float,
    repeats: int,
) -> Table:
    """One row per scenario: fast workers' steps/s without and with the straggler,
    ratio, straggler's pace, goal and a pass/fail mark where a goal applies."""
    t = Table(
        title=f"one worker {factor:g}× slower ({steps} steps, {step_sleep * 1000:g} ms sleep per "
        f"step, {repeats} run{'s' if repeats > 1 else ''} each); steps/s of the slowest fast "
        "worker",
        title_justify="left",
        show_edge=False,
    )
    left = ("scenario", "strategy", "ranks", "params")
    for col in (*left, "without", "with", "ratio", "straggler pace", "goal", ""):
        t.add_column(col, justify="left" if col in left else "right")
    for r in results:
        mark = {True: "[green]pass[/green]", False: "[red]FAIL[/red]", None: ""}[r.passed]
        t.add_row(
            r.scenario.name,
            r.scenario.strategy,
            r.scenario.ranks_text(),
            r.scenario.params_text(),
            f"{r.fast_rate(r.baseline):.2f}",
            f"{r.fast_rate(r.slowed):.2f}",
            f"[bold]{r.ratio:.3f}[/bold]",
            f"{r.straggler_pace:.3f}",
            goal_text(r),
            mark,
        )
    return t
