"""The figures of ``dmlctl bench parallel``: each run's records read back, reduced
per layout, and the table (torch-free).

Definitions, per layout:

* **memory** — a rank's parameter bytes plus its optimizer-state bytes (local shards
  of DTensors; a pipeline rank's own stages), measured after the first step; the
  largest rank over every run of the layout, also relative to the whole model's
  (one process, same optimizer: the ``model_*`` figures of the first worker);
* **tensor-plan layers** — the same restricted to the layers dmlctl's default tensor
  plan splits (attention's wq/wk/wv/wo, the MLP's w1/w2), over those layers' whole
  bytes (largest rank);
* **samples/s** — per data-parallel replica: the mean over the ranks of their
  ``samples_per_s`` over the timed window (the ranks of a replica see the same
  batches); for the whole run: that times the replicas; the median over the runs,
  and its ratio to the baseline layout's median;
* **goals** — a layout's bounds on ``memory_ratio`` or ``sharded_ratio``, checked
  and reported (met or not), never enforced.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.table import Table

from dmlctl.bench.launch_overhead import summarize
from dmlctl.bench.runs import BenchFailed

MEMORY = ("param_bytes", "optim_bytes", "sharded_bytes")
"""What every rank logs of what it holds (bytes)."""
MODEL = tuple(f"model_{k}" for k in MEMORY)
"""The same for the whole model in one process (the first worker logs them)."""
GOAL_LABELS = {"memory_ratio": "memory", "sharded_ratio": "tp layers"}


@dataclass(frozen=True)
class RunFigures:
    """One run's figures: each rank's bytes (:data:`MEMORY`) and ``samples_per_s``
    by rank, the whole model's bytes (:data:`MEMORY` keys) and the replicas."""

    run_id: str
    ranks: Mapping[int, Mapping[str, float]]
    model: Mapping[str, int]
    replicas: int


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def run_figures(run_id: str, lines: Iterable[str], workers: int) -> RunFigures:
    """Each rank's last record carrying ``samples_per_s`` and :data:`MEMORY`, and the
    ``model_*`` figures from any record; BenchFailed naming the run when a worker's
    record or the model's figures are missing."""
    ranks: dict[int, dict[str, float]] = {}
    model: dict[str, int] = {}
    replicas = 0
    keys = ("samples_per_s", *MEMORY)
    for line in lines:
        try:
            record = json.loads(line)
            rank, values = int(record["rank"]), dict(record["values"])
        except (ValueError, KeyError, TypeError):
            continue
        if all(_number(values.get(k)) for k in keys):
            ranks[rank] = {k: float(values[k]) for k in keys}
            replicas = int(values.get("replicas", replicas))
        if all(_number(values.get(k)) for k in MODEL):
            model = {k.removeprefix("model_"): int(values[k]) for k in MODEL}
    if len(ranks) != workers or not model or replicas < 1:
        raise BenchFailed(
            f"benchmark run {run_id} logged figures from {len(ranks)} of {workers} workers"
            f"{'' if model else ' and none of the whole model'}; see `dmlctl logs {run_id}`"
        )
    return RunFigures(run_id, ranks, model, replicas)


def _memory(runs: Sequence[RunFigures]) -> dict[str, Any]:
    """Each rank's bytes (the largest over the runs) and the largest rank's share of
    the whole model's, in total and of the tensor-plan layers."""
    model = runs[0].model
    ranks = []
    for rank in sorted(runs[0].ranks):
        mine = {k: int(max(r.ranks[rank][k] for r in runs)) for k in MEMORY}
        ranks.append({"rank": rank, **mine, "bytes": mine["param_bytes"] + mine["optim_bytes"]})
    biggest = max(r["bytes"] for r in ranks)
    return {
        "ranks": ranks,
        "memory_bytes": biggest,
        "memory_ratio": biggest / (model["param_bytes"] + model["optim_bytes"]),
        "sharded_ratio": max(r["sharded_bytes"] for r in ranks) / model["sharded_bytes"],
    }


def layout_row(
    title: str, goals: Mapping[str, float], runs: Sequence[RunFigures]
) -> dict[str, Any]:
    """One layout's row of the report (the module docstring's definitions), its
    goals checked; no ratio to the baseline yet (:func:`parallel_json` adds it)."""
    replicas = runs[0].replicas
    per_replica = [statistics.fmean(v["samples_per_s"] for v in r.ranks.values()) for r in runs]
    row: dict[str, Any] = {
        "title": title,
        "replicas": replicas,
        **_memory(runs),
        "replica_samples_per_s": summarize(per_replica),
        "samples_per_s": summarize([replicas * s for s in per_replica]),
        "run_ids": [r.run_id for r in runs],
    }
    row["goals"] = {
        measure: {"bound": bound, "value": row[measure], "met": row[measure] <= bound}
        for measure, bound in goals.items()
    }
    return row


def parallel_json(
    layouts: Mapping[str, tuple[str, Mapping[str, float]]],
    runs: Mapping[str, Sequence[RunFigures]],
    *,
    baseline: str,
    setup: Mapping[str, Any],
) -> dict[str, Any]:
    """The report ``--json`` prints: ``setup``, the whole model's bytes, and a row per
    layout (``layouts``: name → (title, goals), measured by ``runs``), each with
    ``ratio``: its whole-run samples/s median over ``baseline``'s (None when the
    baseline was not run)."""
    rows = {name: layout_row(*layouts[name], runs[name]) for name in layouts}
    base = rows.get(baseline)
    for row in rows.values():
        median = row["samples_per_s"]["median"]
        row["ratio"] = median / base["samples_per_s"]["median"] if base else None
    model = dict(next(iter(runs.values()))[0].model)
    model["bytes"] = model["param_bytes"] + model["optim_bytes"]
    return {**setup, "baseline": baseline, "model": model, "layouts": rows}


def _marked(row: Mapping[str, Any], measure: str) -> str:
    """``row[measure]``, marked ✓ or ✗ when the layout has a goal on it."""
    goal = row["goals"].get(measure)
    mark = "" if goal is None else (" ✓" if goal["met"] else " ✗")
    return f"{row[measure]:.3f}{mark}"


def _goals_line(report: Mapping[str, Any]) -> str:
    """The goals of every layout, for the caption: ``fsdp4 memory ≤ 0.3 (0.250, met)``."""
    goals = [
        f"{name} {GOAL_LABELS.get(m, m)} ≤ {g['bound']:g} ({g['value']:.3f}, "
        f"{'met' if g['met'] else 'NOT met'})"
        for name, row in report["layouts"].items()
        for m, g in row["goals"].items()
    ]
    return f"goals (✓ met, ✗ not): {'; '.join(goals)}" if goals else ""


def render_parallel_table(report: Mapping[str, Any]) -> Table:
    """One row per layout: replicas, the largest rank's memory (MB and share of the
    whole model's), its share of the tensor-plan layers, samples/s for the run and
    per replica, and the ratio to the baseline; goals marked beside their figure
    and spelled out in the caption."""
    model = report["model"]
    title = (
        f"parallel layouts, {report['workers']} workers, global batch "
        f"{report['global_batch']}, steps {report['warmup_steps'] + 1}–{report['steps']} "
        f"timed, {report['repeats']} run(s) each; memory: params + optimizer state "
        f"of the largest rank (whole model: {model['bytes'] / 1e6:.1f} MB)"
    )
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    base = report["baseline"]
    columns = ("layout", "repl.", "MB", "/model", "tp layers", "samples/s", "/replica")
    for col in (*columns, f"/{base}"):
        table.add_column(col, justify="left" if col == "layout" else "right")
    for name, row in report["layouts"].items():
        ratio = row["ratio"]
        table.add_row(
            name,
            str(row["replicas"]),
            f"{row['memory_bytes'] / 1e6:.1f}",
            _marked(row, "memory_ratio"),
            _marked(row, "sharded_ratio"),
            f"{row['samples_per_s']['median']:.1f}",
            f"{row['replica_samples_per_s']['median']:.1f}",
            "" if ratio is None else f"{ratio:.2f}",
        )
    notes = [
        "/model: of the whole model's bytes; tp layers: of the bytes of the layers the "
        f"tensor plan splits (wq/wk/wv/wo, w1/w2); /{base}: whole-run samples/s over {base}'s",
        _goals_line(report),
    ]
    if report.get("failed_runs"):
        notes.append(f"{len(report['failed_runs'])} run(s) failed and were launched once more")
    table.caption = "\n".join(n for n in notes if n)
    table.caption_justify = "left"
    return table
