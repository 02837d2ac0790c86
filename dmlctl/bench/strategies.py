"""``dmlctl bench strategies``: strategy overhead and communication volume.

Two measurements, in the same run, on 2 local workers (jobs and scripts in
``strategy_jobs/``):

1. **Throughput** — ``ssgd`` through a real ``dmlctl launch`` of ``train.py``
   (samples/s of the timed window, mean over ranks, read from ``metrics.jsonl``)
   against the same loop hand-written with DDP, ``ddp_bare.py``, under bare
   ``python -m torch.distributed.run --standalone --nproc-per-node 2`` (it prints its
   samples/s). Same model, data, sampler, batch and steps. Runs alternate (dmlctl,
   bare, dmlctl, …) after one untimed warm-up of each; ``ratio = median(dmlctl) /
   median(bare)``, goal ≥ 0.97.
2. **Bytes per step** on a model of large matrices, each relative to ``ssgd``
   (no compression): ``local-sgd`` period 8 (goal ≤ 1/8), ``ssgd`` PowerSGD rank 1
   (goal ≤ 1/10), int8 (≤ 0.26), top-k at 1 % (≤ 0.021) and sign (≤ 1/30), from
   ``comm_bytes_per_step`` of the window after warm-up, with each run's samples/s
   next to uncompressed ssgd's. A strategy whose module is not installed yet is
   reported as ``pending``.

This module never imports torch. Run directories go to a temporary ``DMLCTL_HOME``.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from dmlctl.bench.proc import bench_env, run_checked
from dmlctl.errors import DmlctlError, UsageError

JOBS_DIR = Path(__file__).resolve().parent / "strategy_jobs"
WORKERS = 2
MIN_REPEATS = 3
WARMUP_STEPS = 48  # untimed steps; a multiple of local-sgd's period 8
RUN_TIMEOUT_S = 600.0
BYTES_JOBS: dict[str, tuple[str, str, float]] = {
    # key: (job file, strategy module, goal for bytes relative to ssgd)
    "local-sgd period 8": ("local_sgd_matrices.yaml", "dmlctl.strategies.local_sgd", 1 / 8),
    "ssgd powersgd rank 1": ("powersgd_matrices.yaml", "dmlctl.strategies.ssgd", 1 / 10),
    # a quarter of float32, plus a float32 scale per bucket
    "ssgd int8": ("int8_matrices.yaml", "dmlctl.strategies.ssgd", 0.26),
    # 1 % of the entries, each a float32 value and an int32 index: 2 %
    "ssgd topk 1%": ("topk_matrices.yaml", "dmlctl.runtime.filters", 0.021),
    # one bit per entry, plus a float32 scale per tensor
    "ssgd sign": ("sign_matrices.yaml", "dmlctl.runtime.filters", 1 / 30),
}


class StrategyBenchFailed(DmlctlError):
    """A benchmark run failed or reported nothing; carries the output's tail."""


def _run(argv: list[str], env: Mapping[str, str], cwd: Path) -> str:
    return run_checked(argv, env, cwd, timeout=RUN_TIMEOUT_S, error=StrategyBenchFailed)


def script_args(model: str, steps: int) -> list[str]:
    """Arguments of both training scripts."""
    return ["--model", model, "--steps", str(steps), "--warmup", str(WARMUP_STEPS)]


def write_job(template: str, steps: int, out_dir: Path) -> Path:
    """A copy of ``strategy_jobs/<template>`` with ``--steps`` set and an absolute workdir."""
    spec = yaml.safe_load((JOBS_DIR / template).read_text(encoding="utf-8"))
    model = spec["args"][spec["args"].index("--model") + 1]
    spec.update(args=script_args(model, steps), workdir=str(JOBS_DIR), workers=WORKERS)
    path = out_dir / template
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def launch_dmlctl(job: Path, env: Mapping[str, str], home: Path) -> dict[str, float]:
    """``dmlctl launch`` ``job``; the last record's values, averaged over ranks."""
    before = set((home / "runs").glob("*"))
    _run([sys.executable, "-m", "dmlctl", "launch", str(job), "--ui", "quiet"], env, job.parent)
    new = sorted(set((home / "runs").glob("*")) - before)
    if len(new) != 1:
        raise StrategyBenchFailed(f"expected one new run directory under {home}, found {len(new)}")
    last: dict[int, dict[str, float]] = {}
    with open(new[0] / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            last[int(rec["rank"])] = rec["values"]
    if len(last) != WORKERS:
        raise StrategyBenchFailed(f"run {new[0].name} reported metrics from {len(last)} ranks")
    keys = set.intersection(*(set(v) for v in last.values()))
    return {
        k: statistics.fmean(float(v[k]) for v in last.values())
        for k in sorted(keys)
        if isinstance(last[0][k], int | float)
    }


def run_bare(steps: int, env: Mapping[str, str], cwd: Path) -> float:
    """The hand-written DDP loop under bare torchrun; its samples/s."""
    out = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(WORKERS),
            str(JOBS_DIR / "ddp_bare.py"),
            *script_args("mlp", steps),
        ],
        env,
        cwd,
    )
    lines = [ln for ln in out.splitlines() if ln.startswith('{"samples_per_s"')]
    if not lines:
        raise StrategyBenchFailed(f"ddp_bare.py printed no result:\n{out[-1500:]}")
    return float(json.loads(lines[-1])["samples_per_s"])


def _summary(samples: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def run_strategy_bench(steps: int, repeats: int, *, console: Console) -> dict[str, Any]:
    """Both measurements; the report (see the module docstring for its meaning)."""
    if steps < WARMUP_STEPS + 8 or (steps - WARMUP_STEPS) % 8:
        raise UsageError(f"--steps must be {WARMUP_STEPS} + a positive multiple of 8, got {steps}")
    if repeats < MIN_REPEATS:
        raise UsageError(f"--repeats must be at least {MIN_REPEATS}, got {repeats}")
    with tempfile.TemporaryDirectory(prefix="dmlctl-bench-strategies-") as tmp:
        home = Path(tmp) / "home"
        env = bench_env(home, OMP_NUM_THREADS="1")
        ssgd_job = write_job("ssgd.yaml", steps, Path(tmp))
        rates: dict[str, list[float]] = {"dmlctl": [], "bare": []}
        for round_ in range(repeats + 1):
            label = "warm-up" if round_ == 0 else f"{round_}/{repeats}"
            console.print(f"[dim]throughput {label}[/dim]", highlight=False)
            dml = launch_dmlctl(ssgd_job, env, home)["samples_per_s"]
            bare = run_bare(steps, env, Path(tmp))
            if round_ > 0:
                rates["dmlctl"].append(dml)
                rates["bare"].append(bare)
        console.print("[dim]bytes per step[/dim]", highlight=False)
        ref = launch_dmlctl(write_job("ssgd_matrices.yaml", steps, Path(tmp)), env, home)
        ref_bytes = ref["comm_bytes_per_step"]
        rows: dict[str, dict[str, Any]] = {
            "ssgd": {
                "bytes_per_step": ref_bytes,
                "ratio": 1.0,
                "goal": None,
                "samples_per_s": ref.get("samples_per_s"),
            }
        }
        for name, (template, module, goal) in BYTES_JOBS.items():
            if importlib.util.find_spec(module) is None:
                rows[name] = {"status": "pending", "goal": goal}
                continue
            got = launch_dmlctl(write_job(template, steps, Path(tmp)), env, home)
            rows[name] = {
                "bytes_per_step": got["comm_bytes_per_step"],
                "goal": goal,
                "ratio": got["comm_bytes_per_step"] / ref_bytes,
                "samples_per_s": got.get("samples_per_s"),
            }
    dml_s, bare_s = _summary(rates["dmlctl"]), _summary(rates["bare"])
    return {
        "workers": WORKERS,
        "steps": steps,
        "warmup_steps": WARMUP_STEPS,
        "repeats": repeats,
        "dmlctl_samples_per_s": dml_s,
        "bare_samples_per_s": bare_s,
        "throughput_ratio": dml_s["median"] / bare_s["median"],
        "throughput_goal": 0.97,
        "bytes": rows,
    }


def render_strategies_table(report: Mapping[str, Any]) -> list[Table]:
    """Two tables: throughput (median/min/max per side + ratio), bytes per step."""
    t = Table(
        title=f"ssgd throughput, {report['workers']} workers, {report['repeats']} runs "
        "each (samples/s per rank)",
        title_justify="left",
        show_edge=False,
    )
    for col in ("side", "median", "min", "max"):
        t.add_column(col, justify="left" if col == "side" else "right")
    for side in ("dmlctl", "bare"):
        s = report[f"{side}_samples_per_s"]
        t.add_row(side, f"{s['median']:.0f}", f"{s['min']:.0f}", f"{s['max']:.0f}")
    t.add_row(
        "[bold]dmlctl/bare[/bold]",
        f"[bold]{report['throughput_ratio']:.3f}[/bold]",
        "",
        f"goal ≥ {report['throughput_goal']}",
    )
    b = Table(
        title="bytes per step relative to ssgd (large matrices)",
        title_justify="left",
        show_edge=False,
    )
    for col in ("strategy", "bytes/step", "ratio", "goal", "samples/s"):
        b.add_column(col, justify="left" if col == "strategy" else "right")
    for name, row in report["bytes"].items():
        goal = "" if row["goal"] is None else f"≤ {row['goal']:.3f}"
        rate = row.get("samples_per_s")
        shown = f"{rate:.0f}" if isinstance(rate, int | float) else ""
        if row.get("status") == "pending":
            b.add_row(name, "pending", "", goal, "")
        else:
            b.add_row(name, f"{row['bytes_per_step']:.0f}", f"{row['ratio']:.4f}", goal, shown)
    return [t, b]
