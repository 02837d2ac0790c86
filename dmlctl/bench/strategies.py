"""``dmlctl bench strategies``: strategy overhead, communication volume, filters and
overlap.

Four sections, each optional, in the same run on 2 local workers (the runs are
:mod:`dmlctl.bench.strategy_rows`; jobs and scripts in ``strategy_jobs/``):

1. **throughput** — ``ssgd`` through a real ``dmlctl launch`` of ``train.py``
   (samples/s of the timed window, mean over the workers, read from
   ``metrics.jsonl``) against the same loop hand-written with DDP, ``ddp_bare.py``,
   under bare ``python -m torch.distributed.run --standalone --nproc-per-node 2`` (it
   prints its samples/s). Same model, data, sampler, batch and steps. Runs alternate
   (dmlctl, bare, dmlctl, …) after one untimed warm-up of each; ``ratio =
   median(dmlctl) / median(bare)``, goal ≥ 0.97.
2. **bytes** — bytes per step on a model of large matrices, each relative to
   ``ssgd`` without compression: ``local-sgd`` period 8 (goal ≤ 1/8), PowerSGD rank 1
   (≤ 1/10), int8 (≤ 0.26), top-k at 1 % (≤ 0.021) and sign (≤ 1/30), from
   ``comm_bytes_per_step`` of the window after warm-up, with each run's samples/s.
3. **filters** — the model filter (``threshold``) on local-sgd, bmuf and easgd, each
   against the same strategy without it, and asgd's push filters (push + pull per
   step) against plain asgd.
4. **overlap** — asgd, easgd-async and aadmm with ``overlap: false`` and ``true``,
   alternating, ``--repeats`` runs each: samples/s, comm share (the time the trainer
   waits for communication), and ``ratio = median(true) / median(false)``.

This module never imports torch. Run directories go to a temporary ``DMLCTL_HOME``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from dmlctl.bench.launch_overhead import summarize
from dmlctl.bench.plan import announce, planned
from dmlctl.bench.proc import bench_env, run_checked, torchrun_argv
from dmlctl.bench.runs import BENCH_RANKS, BenchInterrupted, BenchPartial, interrupted_after
from dmlctl.bench.strategy_rows import (
    BYTES,
    FILTERS,
    JOBS_DIR,
    OVERLAP,
    WARMUP_STEPS,
    WORKERS,
    Row,
    job_spec,
    script_args,
)
from dmlctl.errors import DmlctlError, UsageError

MIN_REPEATS = 3
RUN_TIMEOUT_S = 600.0
SECTIONS = ("throughput", "bytes", "filters", "overlap")


class StrategyBenchFailed(DmlctlError):
    """A benchmark run failed or reported nothing; carries the output's tail."""


def _run(argv: list[str], env: Mapping[str, str], cwd: Path) -> str:
    return run_checked(argv, env, cwd, timeout=RUN_TIMEOUT_S, error=StrategyBenchFailed)


def write_job(spec: Mapping[str, Any], out_dir: Path) -> Path:
    """``spec`` as a job file in ``out_dir``, named after the job."""
    path = out_dir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump({"ranks": BENCH_RANKS, **spec}), encoding="utf-8")
    return path


def launch_dmlctl(job: Path, env: Mapping[str, str], home: Path) -> dict[str, float]:
    """``dmlctl launch`` ``job``; each worker's last timed record (the one with
    ``samples_per_s``; servers report none), averaged over the workers."""
    before = set((home / "runs").glob("*"))
    _run([sys.executable, "-m", "dmlctl", "launch", str(job), "--ui", "quiet"], env, job.parent)
    new = sorted(set((home / "runs").glob("*")) - before)
    if len(new) != 1:
        raise StrategyBenchFailed(f"expected one new run directory under {home}, found {len(new)}")
    last: dict[int, dict[str, Any]] = {}
    with open(new[0] / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if "samples_per_s" in rec["values"]:
                last[int(rec["rank"])] = rec["values"]
    if len(last) != WORKERS:
        raise StrategyBenchFailed(f"run {new[0].name} reported metrics from {len(last)} workers")
    keys = set.intersection(*(set(v) for v in last.values()))
    return {
        k: statistics.fmean(float(v[k]) for v in last.values())
        for k in sorted(keys)
        if all(isinstance(v[k], int | float) for v in last.values())
    }


def run_bare(steps: int, env: Mapping[str, str], cwd: Path) -> float:
    """The hand-written DDP loop under bare torchrun; its samples/s."""
    out = _run(
        torchrun_argv(WORKERS, JOBS_DIR / "ddp_bare.py", script_args("mlp", steps)), env, cwd
    )
    lines = [ln for ln in out.splitlines() if ln.startswith('{"samples_per_s"')]
    if not lines:
        raise StrategyBenchFailed(f"ddp_bare.py printed no result:\n{out[-1500:]}")
    return float(json.loads(lines[-1])["samples_per_s"])


def parse_sections(text: str) -> list[str]:
    """``--sections``: a comma-separated subset of :data:`SECTIONS`, in their order."""
    asked = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in asked if s not in SECTIONS]
    if unknown or not asked:
        raise UsageError(
            f"--sections: unknown {', '.join(unknown) or 'empty list'}; "
            f"choose from {', '.join(SECTIONS)}"
        )
    return [s for s in SECTIONS if s in asked]


class _Runner:
    """Launches the benchmark's jobs in one temporary home and directory."""

    def __init__(self, tmp: Path, steps: int, console: Console) -> None:
        self.home, self.dir, self.steps, self.console = tmp / "home", tmp, steps, console
        self.env = bench_env(self.home, OMP_NUM_THREADS="1")
        self.done = 0  # runs that ended

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/dim]", highlight=False)

    def launch(self, name: str, row: Row, **params: Any) -> dict[str, float]:
        """One run of ``row`` (with ``params`` added); its averaged last records."""
        if params:
            row = replace(row, params={**row.params, **params})
        job = write_job(job_spec(name, row, self.steps), self.dir)
        got = launch_dmlctl(job, self.env, self.home)
        self.done += 1
        return got

    def throughput(self, repeats: int) -> dict[str, Any]:
        ssgd = Row("ssgd", model="mlp")
        rates: dict[str, list[float]] = {"dmlctl": [], "bare": []}
        for round_ in range(repeats + 1):
            self.say(f"throughput {'warm-up' if round_ == 0 else f'{round_}/{repeats}'}")
            dml = self.launch("ssgd", ssgd)["samples_per_s"]
            bare = run_bare(self.steps, self.env, self.dir)
            self.done += 1
            if round_ > 0:
                rates["dmlctl"].append(dml)
                rates["bare"].append(bare)
        dml_s, bare_s = summarize(rates["dmlctl"]), summarize(rates["bare"])
        return {
            "dmlctl_samples_per_s": dml_s,
            "bare_samples_per_s": bare_s,
            "throughput_ratio": dml_s["median"] / bare_s["median"],
            "throughput_goal": 0.97,
        }

    def table(self, label: str, rows: Mapping[str, Row]) -> dict[str, dict[str, Any]]:
        """Bytes per step and samples/s of every row, each relative to its baseline."""
        out: dict[str, dict[str, Any]] = {}
        for name, row in rows.items():
            self.say(f"{label}: {name}")
            got = self.launch(name, row)
            out[name] = {
                "bytes_per_step": got["comm_bytes_per_step"],
                "samples_per_s": got.get("samples_per_s"),
                "goal": row.goal,
                "against": row.against,
            }
        return with_ratios(out)

    def overlap(self, repeats: int) -> dict[str, dict[str, Any]]:
        """Each strategy with overlap off and on, alternating, ``repeats`` times each."""
        out: dict[str, dict[str, Any]] = {}
        for name, row in OVERLAP.items():
            runs: dict[str, list[dict[str, float]]] = {"false": [], "true": []}
            for i in range(repeats):
                for side in ("false", "true"):
                    self.say(f"overlap: {name}, overlap {side}, {i + 1}/{repeats}")
                    got = self.launch(f"{name} overlap {side}", row, overlap=side == "true")
                    runs[side].append(got)
            out[name] = overlap_row(runs)
        return out


def with_ratios(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``rows`` with ``ratio``: each row's bytes per step over those of the row it
    names in ``against`` (rows without a measured baseline get none)."""
    for row in rows.values():
        base = rows.get(row["against"] or "", {})
        if "bytes_per_step" in row and base.get("bytes_per_step"):
            row["ratio"] = row["bytes_per_step"] / base["bytes_per_step"]
    return rows


def overlap_row(runs: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, Any]:
    """One strategy's overlap figures from its runs without (``false``) and with."""
    row: dict[str, Any] = {}
    for side, results in runs.items():
        row[side] = {
            "samples_per_s": summarize([r["samples_per_s"] for r in results]),
            "comm_share": summarize([r["comm_share"] for r in results]),
            "bytes_per_step": statistics.median(r["comm_bytes_per_step"] for r in results),
        }
    row["ratio"] = row["true"]["samples_per_s"]["median"] / row["false"]["samples_per_s"]["median"]
    return row


STARTUP_S = 4.0
"""About what a run takes besides its steps (launch, start-up, exit) on 2 cores."""
STEP_S = 0.011
"""About one step of the bench's models on 2 workers, 2 cores."""


def runs_of(repeats: int, sections: Sequence[str]) -> dict[str, int]:
    """The runs each of ``sections`` makes (in the order they run)."""
    count = {
        "throughput": 2 * (repeats + 1),
        "bytes": len(BYTES),
        "filters": len(FILTERS),
        "overlap": 2 * repeats * len(OVERLAP),
    }
    return {s: count[s] for s in SECTIONS if s in sections}


def plan(steps: int, repeats: int, sections: Sequence[str]) -> str:
    """The runs :func:`run_strategy_bench` makes for ``sections``, and about how long."""
    count = runs_of(repeats, sections)
    why = " + ".join(f"{n} {s}" for s, n in count.items())
    return planned(sum(count.values()), why, STARTUP_S + steps * STEP_S)


def run_strategy_bench(
    steps: int, repeats: int, *, console: Console, sections: Sequence[str] = SECTIONS
) -> dict[str, Any]:
    """The ``sections`` asked for; the report (see the module docstring)."""
    if steps < WARMUP_STEPS + 8 or (steps - WARMUP_STEPS) % 8:
        raise UsageError(f"--steps must be {WARMUP_STEPS} + a positive multiple of 8, got {steps}")
    if repeats < MIN_REPEATS:
        raise UsageError(f"--repeats must be at least {MIN_REPEATS}, got {repeats}")
    announce(console, "strategies", plan(steps, repeats, sections))
    report: dict[str, Any] = {
        "workers": WORKERS,
        "steps": steps,
        "warmup_steps": WARMUP_STEPS,
        "repeats": repeats,
        "sections": list(sections),
    }
    with tempfile.TemporaryDirectory(prefix="dmlctl-bench-strategies-") as tmp:
        runner = _Runner(Path(tmp), steps, console)
        done: list[str] = []
        try:
            for section in (s for s in SECTIONS if s in sections):
                if section == "throughput":
                    report.update(runner.throughput(repeats))
                elif section == "overlap":
                    report["overlap"] = runner.overlap(repeats)
                else:
                    rows = BYTES if section == "bytes" else FILTERS
                    report[section] = runner.table(_LABELS[section], rows)
                done.append(section)
        except BenchInterrupted:
            if not done:
                raise
            note = interrupted_after(runner.done, sum(runs_of(repeats, sections).values()))
            raise BenchPartial(note, {**report, "sections": done, "partial": note}) from None
    return report


_LABELS = {"bytes": "bytes per step", "filters": "filters"}
"""What the progress lines call each table section."""
