"""``dmlctl bench accuracy``: the quality every strategy reaches with its defaults,
against one process, on one of two tasks (:data:`TASKS`):

* ``digits`` — test accuracy of a small CNN on scikit-learn's digits
  (``accuracy_job/digits.py``), SGD + momentum or Adam, 20 epochs of 32 images per
  worker; a row passes within :data:`TOLERANCE` (1.5 points) of one process (the
  criterion of ``tests/strategies/test_accuracy.py``);
* ``lm`` — validation loss of a small causal transformer language model on a
  generated text (``accuracy_job/lm.py``), AdamW or SGD + Nesterov, 3 epochs at a
  global batch of 32 windows — one process takes the same global batch and the same
  samples; a row passes within :data:`LM_TOLERANCE` (3 %) of one process, ssgd within
  :data:`LM_SSGD_TOLERANCE` (0.5 %) (the criterion of
  ``tests/strategies/test_lm_quality.py``).

Each run is an ordinary ``dmlctl launch`` (``--ui quiet``, in a temporary
``DMLCTL_HOME``) of the task's script. First the single-process baseline (one worker,
strategy ``none``) per optimizer, then every row on 2 workers (plus one parameter
server where the strategy has them). The value is rank 0's last record of the task's
metric, measured on the model the strategy ends with.

This module never imports torch; the digits task needs scikit-learn on this machine.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.table import Table

from dmlctl.bench.plan import planned
from dmlctl.bench.proc import bench_env, run_checked
from dmlctl.bench.runs import BENCH_RANKS
from dmlctl.errors import DmlctlError, UsageError
from dmlctl.spec.models import uses_servers
from dmlctl.text import plural

JOB_DIR = Path(__file__).resolve().parent / "accuracy_job"
TOLERANCE = 0.015
LM_TOLERANCE = 0.03
LM_SSGD_TOLERANCE = 0.005
WORKERS = 2
RUN_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Candidate:
    """One row: a strategy with its parameters (defaults unless a compression)."""

    name: str
    strategy: str
    params: Mapping[str, Any] = field(default_factory=dict)
    servers: int = 0


CANDIDATES: tuple[Candidate, ...] = (
    Candidate("ssgd", "ssgd"),
    Candidate("ssgd fp16", "ssgd", {"compression": "fp16"}),
    Candidate("ssgd bf16", "ssgd", {"compression": "bf16"}),
    Candidate("ssgd powersgd", "ssgd", {"compression": "powersgd"}),
    Candidate("ssgd int8", "ssgd", {"compression": "int8"}),
    Candidate("ssgd topk", "ssgd", {"compression": "topk"}),
    Candidate("ssgd sign", "ssgd", {"compression": "sign"}),
    Candidate("local-sgd", "local-sgd"),
    Candidate("bmuf", "bmuf"),
    Candidate("easgd", "easgd"),
    Candidate("admm", "admm"),
    Candidate("dpsgd", "dpsgd"),
    Candidate("hogwild", "hogwild"),
    Candidate("asgd", "asgd", servers=1),
    Candidate("ssp", "ssp", servers=1),
    Candidate("adadelay", "adadelay", servers=1),
    Candidate("easgd-async", "easgd-async", servers=1),
    Candidate("sync-ps", "sync-ps", servers=1),
    Candidate("aadmm", "aadmm", servers=1),
)
BASELINE = Candidate("single process", "none")
LM_CANDIDATES: tuple[Candidate, ...] = tuple(
    Candidate(name, name, servers=1 if uses_servers(name) else 0)
    for name in (
        "ssgd", "local-sgd", "bmuf", "easgd", "admm", "dpsgd", "ensemble", "hogwild",
        "asgd", "ssp", "adadelay", "easgd-async", "sync-ps", "aadmm",
    )
)  # fmt: skip


STARTUP_S = 2.5
"""Seconds of a bench run that do not depend on its epochs (launch, start-up, exit)."""


@dataclass(frozen=True)
class Task:
    """A workload of the bench: its script, optimizers, metric and verdict."""

    name: str
    script: str
    optimizers: tuple[str, ...]
    labels: Mapping[str, str]
    metric: str
    """The key rank 0 logs at the end (``test_acc`` or ``val_loss``)."""
    what: str
    lower_is_better: bool
    epochs: int
    data: str
    candidates: tuple[Candidate, ...]
    more_optimizers: tuple[str, ...] = ()
    """Optimizers run only when asked for by name (``--optimizers``)."""
    run_s: float = 8.0
    """Seconds one run takes at :attr:`epochs` on a 2-core machine (measured: the
    whole table's time over its runs), for the estimate the bench prints first."""

    def planned(self, rows: int, optimizers: int, epochs: int) -> str:
        """``46 runs (23 rows × 2 optimizers) of about 6 s each on 2 cores: about
        0:04:36``; a run's time scales with ``epochs`` past its start-up."""
        each = STARTUP_S + (self.run_s - STARTUP_S) * epochs / self.epochs
        why = f"{plural(rows, 'row')} × {plural(optimizers, 'optimizer')}"
        return planned(rows * optimizers, why, each)

    def delta(self, value: float, base: float) -> float:
        """``value`` against ``base``: relative for a loss, in points for an accuracy."""
        return value / base - 1.0 if self.lower_is_better else value - base

    def tolerance(self, candidate: str) -> float:
        """How far below one process the row may end (a fraction of it for a loss)."""
        if not self.lower_is_better:
            return TOLERANCE
        return LM_SSGD_TOLERANCE if candidate == "ssgd" else LM_TOLERANCE

    def within(self, candidate: str, delta: float) -> bool:
        """Whether ``delta`` (:meth:`delta`) passes for the row ``candidate``."""
        limit = self.tolerance(candidate) + 1e-9
        return delta <= limit if self.lower_is_better else delta >= -limit


TASKS: dict[str, Task] = {
    "digits": Task(
        name="digits",
        script="digits.py",
        optimizers=("momentum", "adam"),
        labels={"momentum": "SGD + momentum", "adam": "Adam"},
        metric="test_acc",
        what="test accuracy",
        lower_is_better=False,
        epochs=20,
        data="scikit-learn digits (1,437 train / 360 test images)",
        candidates=CANDIDATES,
        run_s=6.0,
    ),
    "lm": Task(
        name="lm",
        script="lm.py",
        optimizers=("adamw", "nesterov"),
        labels={"adamw": "AdamW", "nesterov": "SGD + Nesterov", "sgd": "plain SGD"},
        metric="val_loss",
        what="validation loss",
        lower_is_better=True,
        epochs=3,
        data="a generated text (36,000 train / 4,000 validation characters), "
        "a 2-layer causal transformer",
        candidates=LM_CANDIDATES,
        more_optimizers=("sgd",),
        run_s=7.9,
    ),
}


class AccuracyBenchFailed(DmlctlError):
    """A run failed or logged no value of the task's metric."""


def pick(names: str | None, choices: Sequence[str], what: str) -> list[str]:
    """The comma-separated ``names`` (all ``choices`` when None), in ``choices``'
    order; UsageError naming the valid ones for an unknown name."""
    if names is None:
        return list(choices)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in choices]
    if unknown or not wanted:
        raise UsageError(
            f"unknown {what} {', '.join(unknown) or '(none given)'}; valid: {', '.join(choices)}"
        )
    return [c for c in choices if c in wanted]


def require_sklearn() -> None:
    """UsageError (exit 2) when scikit-learn, which ships the digits, is missing."""
    if importlib.util.find_spec("sklearn") is None:
        raise UsageError("dmlctl bench accuracy needs scikit-learn: pip install scikit-learn")


def job_spec(
    candidate: Candidate, optimizer: str, epochs: int, task: Task = TASKS["digits"]
) -> dict[str, Any]:
    """The job file of one run."""
    spec: dict[str, Any] = {
        "name": f"{task.name}-" + candidate.name.replace(" ", "-"),
        "workdir": str(JOB_DIR),
        "script": task.script,
        "args": ["--optimizer", optimizer, "--epochs", str(epochs)],
        "workers": 1 if candidate is BASELINE else WORKERS,
        "strategy": {"name": candidate.strategy, "params": dict(candidate.params)},
    }
    if candidate.servers:
        spec["parameter_servers"] = candidate.servers
    return spec


def logged_value(run_dir: Path, metric: str = "test_acc") -> float:
    """Rank 0's last ``metric`` in the run's ``metrics.jsonl``."""
    found: float | None = None
    path = run_dir / "metrics.jsonl"
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            value = record.get("values", {}).get(metric)
            if int(record.get("rank", -1)) == 0 and isinstance(value, int | float):
                found = float(value)
    if found is None:
        raise AccuracyBenchFailed(f"run {run_dir.name} logged no {metric} in {path}")
    return found


def launch(
    spec: Mapping[str, Any], tmp: Path, home: Path, env: Mapping[str, str], metric: str
) -> float:
    """``dmlctl launch`` of ``spec``; its logged ``metric``."""
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump({"ranks": BENCH_RANKS, **spec}), encoding="utf-8")
    before = set((home / "runs").glob("*"))
    argv = [sys.executable, "-m", "dmlctl", "launch", str(job), "--ui", "quiet"]
    run_checked(argv, env, tmp, timeout=RUN_TIMEOUT_S, error=AccuracyBenchFailed)
    new = sorted(set((home / "runs").glob("*")) - before)
    if len(new) != 1:
        raise AccuracyBenchFailed(f"expected one new run directory under {home}, found {len(new)}")
    return logged_value(new[0], metric)


def run_accuracy_bench(
    candidates: Sequence[Candidate],
    optimizers: Sequence[str],
    epochs: int,
    progress: Callable[[str], None],
    task: Task = TASKS["digits"],
) -> dict[str, Any]:
    """The baseline and every candidate × optimizer; the report (module docstring)."""
    if task.name == "digits":
        require_sklearn()
    if epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {epochs}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dmlctl-bench-accuracy-") as name:
        tmp = Path(name)
        home = tmp / "home"
        env = bench_env(home, OMP_NUM_THREADS="1")
        for candidate in (BASELINE, *candidates):
            value: dict[str, float] = {}
            for optimizer in optimizers:
                progress(f"{candidate.name} with {task.labels[optimizer]}")
                spec = job_spec(candidate, optimizer, epochs, task)
                value[optimizer] = launch(spec, tmp, home, env, task.metric)
            rows.append({"name": candidate.name, "value": value})
    return verdict(task, optimizers, epochs, rows[0]["value"], rows[1:])


def verdict(
    task: Task,
    optimizers: Sequence[str],
    epochs: int,
    baseline: Mapping[str, float],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """The report: ``rows`` (name, value per optimizer) with their deltas to
    ``baseline`` and whether each is within the task's tolerance."""
    for row in rows:
        row["delta"] = {o: task.delta(row["value"][o], baseline[o]) for o in optimizers}
        row["ok"] = all(task.within(row["name"], d) for d in row["delta"].values())
        row["tolerance"] = task.tolerance(row["name"])
    return {
        "task": task.name,
        "metric": task.what,
        "lower_is_better": task.lower_is_better,
        "data": task.data,
        "workers": WORKERS,
        "epochs": epochs,
        "optimizers": list(optimizers),
        "labels": {o: task.labels[o] for o in optimizers},
        "baseline": dict(baseline),
        "rows": rows,
    }


def _cell(report: Mapping[str, Any], value: float, delta: float) -> str:
    """``0.9722 (-0.3)`` (points) for an accuracy, ``0.6412 (+1.0 %)`` for a loss."""
    if report["lower_is_better"]:
        return f"{value:.4f} ({delta * 100:+.1f} %)"
    return f"{value:.4f} ({delta * 100:+.1f})"


def render_accuracy_table(report: Mapping[str, Any]) -> Table:
    """strategy | per optimizer: the value (Δ to the baseline) | within tolerance."""
    optimizers = list(report["optimizers"])
    table = Table(
        title=f"{report['metric']} on {report['data']}, {report['workers']} workers, "
        f"{report['epochs']} epochs, strategy defaults",
        title_justify="left",
        show_edge=False,
    )
    table.add_column("strategy")
    for optimizer in optimizers:
        table.add_column(report["labels"][optimizer], justify="right")
    table.add_column("within", justify="right")
    base = report["baseline"]
    table.add_row("single process", *(f"{base[o]:.4f}" for o in optimizers), "")
    for row in report["rows"]:
        cells = [_cell(report, row["value"][o], row["delta"][o]) for o in optimizers]
        bound = f"{row['tolerance'] * 100:g} {'%' if report['lower_is_better'] else 'pts'}"
        verdict_text = "yes" if row["ok"] else "[bold red]no[/bold red]"
        table.add_row(row["name"], *cells, f"{verdict_text} ({bound})")
    return table
