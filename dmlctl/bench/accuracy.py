"""``dmlctl bench accuracy``: test accuracy on real data, every strategy against one
process.

Each run is an ordinary ``dmlctl launch`` (``--ui quiet``, in a temporary
``DMLCTL_HOME``) of ``accuracy_job/digits.py``: a small CNN on scikit-learn's digits,
the strategy's defaults, SGD + momentum or Adam. First the single-process baseline
(one worker, strategy ``none``) per optimizer, then every strategy and every ssgd
compression on 2 workers (plus one parameter server where the strategy has them).
The accuracy is rank 0's ``test_acc`` record, measured on the model the strategy ends
with. A row passes when it is within :data:`TOLERANCE` of the baseline — the
criterion of the test suite's accuracy table (``tests/strategies/test_accuracy.py``).

This module never imports torch; the job needs scikit-learn on this machine.
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

from dmlctl.bench.proc import bench_env, run_checked
from dmlctl.errors import DmlctlError, UsageError

JOB_DIR = Path(__file__).resolve().parent / "accuracy_job"
OPTIMIZERS = ("momentum", "adam")
TOLERANCE = 0.015
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


class AccuracyBenchFailed(DmlctlError):
    """A run failed or logged no ``test_acc``."""


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
    """UsageError (exit 2) when scikit-learn, which ships the data, is missing."""
    if importlib.util.find_spec("sklearn") is None:
        raise UsageError("dmlctl bench accuracy needs scikit-learn: pip install scikit-learn")


def job_spec(candidate: Candidate, optimizer: str, epochs: int) -> dict[str, Any]:
    """The job file of one run."""
    spec: dict[str, Any] = {
        "name": "accuracy-" + candidate.name.replace(" ", "-"),
        "workdir": str(JOB_DIR),
        "script": "digits.py",
        "args": ["--optimizer", optimizer, "--epochs", str(epochs)],
        "workers": 1 if candidate is BASELINE else WORKERS,
        "strategy": {"name": candidate.strategy, "params": dict(candidate.params)},
    }
    if candidate.servers:
        spec["parameter_servers"] = candidate.servers
    return spec


def logged_accuracy(run_dir: Path) -> float:
    """Rank 0's last ``test_acc`` in the run's ``metrics.jsonl``."""
    found: float | None = None
    path = run_dir / "metrics.jsonl"
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            value = record.get("values", {}).get("test_acc")
            if int(record.get("rank", -1)) == 0 and isinstance(value, int | float):
                found = float(value)
    if found is None:
        raise AccuracyBenchFailed(f"run {run_dir.name} logged no test_acc in {path}")
    return found


def launch(spec: Mapping[str, Any], tmp: Path, home: Path, env: Mapping[str, str]) -> float:
    """``dmlctl launch`` of ``spec``; its test accuracy."""
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump(dict(spec)), encoding="utf-8")
    before = set((home / "runs").glob("*"))
    argv = [sys.executable, "-m", "dmlctl", "launch", str(job), "--ui", "quiet"]
    run_checked(argv, env, tmp, timeout=RUN_TIMEOUT_S, error=AccuracyBenchFailed)
    new = sorted(set((home / "runs").glob("*")) - before)
    if len(new) != 1:
        raise AccuracyBenchFailed(f"expected one new run directory under {home}, found {len(new)}")
    return logged_accuracy(new[0])


def run_accuracy_bench(
    candidates: Sequence[Candidate],
    optimizers: Sequence[str],
    epochs: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """The baseline and every candidate × optimizer; the report (module docstring)."""
    require_sklearn()
    if epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {epochs}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dmlctl-bench-accuracy-") as name:
        tmp = Path(name)
        home = tmp / "home"
        env = bench_env(home, OMP_NUM_THREADS="1")
        for candidate in (BASELINE, *candidates):
            accuracy: dict[str, float] = {}
            for optimizer in optimizers:
                progress(f"{candidate.name} with {optimizer}")
                spec = job_spec(candidate, optimizer, epochs)
                accuracy[optimizer] = launch(spec, tmp, home, env)
            rows.append({"name": candidate.name, "accuracy": accuracy})
    baseline = rows[0]["accuracy"]
    for row in rows[1:]:
        row["delta"] = {o: row["accuracy"][o] - baseline[o] for o in optimizers}
        row["ok"] = all(d >= -TOLERANCE - 1e-9 for d in row["delta"].values())
    return {
        "data": "scikit-learn digits (1,437 train / 360 test images)",
        "workers": WORKERS,
        "epochs": epochs,
        "optimizers": list(optimizers),
        "tolerance": TOLERANCE,
        "baseline": baseline,
        "rows": rows[1:],
    }


def render_accuracy_table(report: Mapping[str, Any]) -> Table:
    """strategy | per optimizer: test accuracy (Δ to the baseline) | within tolerance."""
    optimizers = list(report["optimizers"])
    table = Table(
        title=f"test accuracy on {report['data']}, {report['workers']} workers, "
        f"{report['epochs']} epochs, strategy defaults",
        title_justify="left",
        show_edge=False,
    )
    table.add_column("strategy")
    for optimizer in optimizers:
        table.add_column("SGD + momentum" if optimizer == "momentum" else "Adam", justify="right")
    table.add_column(f"within {report['tolerance'] * 100:.1f} pts", justify="right")
    base = report["baseline"]
    table.add_row("single process", *(f"{base[o]:.4f}" for o in optimizers), "")
    for row in report["rows"]:
        cells = [f"{row['accuracy'][o]:.4f} ({row['delta'][o] * 100:+.1f})" for o in optimizers]
        table.add_row(row["name"], *cells, "yes" if row["ok"] else "[bold red]no[/bold red]")
    return table
