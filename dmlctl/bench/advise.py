"""``dmlctl bench advise``: run the user's own job once per candidate strategy and
read from what it logged when each reached the target, at what traffic.

Each candidate is an ordinary ``dmlctl launch --ui quiet`` of a copy of the job file
whose ``strategy`` (and ``parameter_servers``, for the strategies that have them)
is the candidate's — same script, arguments, seed and data — in the user's
``DMLCTL_HOME``, so every run shows in ``dmlctl status``. A run still going when the
budget is spent is stopped as Ctrl-C would (its ranks get their grace period). A
candidate whose run fails is reported as failed and the next one runs. Never imports
torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dmlctl.bench.advise_report import Outcome, analyse
from dmlctl.bench.advise_spec import Candidate, Target
from dmlctl.bench.proc import bench_env
from dmlctl.runs.store import RunStore, dmlctl_home
from dmlctl.spec.loader import load_job
from dmlctl.spec.models import JobSpec

STOP_GRACE_S = 60.0
"""Seconds a stopped candidate's launch gets to tear its run down before it is killed."""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class AdviseRequest:
    """One ``bench advise`` invocation, validated."""

    job_file: Path
    job: JobSpec
    candidates: Sequence[Candidate]
    target: Target
    budget_s: float
    cluster_file: Path | None = None


def candidate_job(request: AdviseRequest, candidate: Candidate) -> dict[str, Any]:
    """The user's job file as a mapping, with the candidate's strategy, servers and a
    name saying which strategy it runs (``<job>-<strategy>``); ``workdir`` absolute
    (the copy lives elsewhere)."""
    raw = yaml.safe_load(request.job_file.read_text(encoding="utf-8")) or {}
    raw["name"] = f"{request.job.name}-{candidate.strategy}"
    raw["strategy"] = candidate.strategy_block()
    raw["parameter_servers"] = candidate.servers
    if not candidate.servers:
        raw.pop("server_hosts", None)
    raw["workdir"] = request.job.workdir
    raw["script"] = request.job.script
    return dict(raw)


def run_candidates(request: AdviseRequest, progress: Progress) -> list[Outcome]:
    """Every candidate in turn, each to its end or the budget; their outcomes in
    the candidates' order."""
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="dmlctl-advise-") as tmp:
        for i, candidate in enumerate(request.candidates, 1):
            progress(f"{i}/{len(request.candidates)} {candidate.label}")
            job_file = Path(tmp) / f"candidate-{i}.yaml"
            job_file.write_text(yaml.safe_dump(candidate_job(request, candidate)))
            load_job(job_file)  # the copy is valid when the user's file is
            outcomes.append(_run_one(request, candidate, job_file, Path(tmp) / f"launch-{i}.out"))
    return outcomes


def _run_one(request: AdviseRequest, candidate: Candidate, job_file: Path, out: Path) -> Outcome:
    """Launch ``job_file`` (its output to ``out``), wait up to the budget, analyse."""
    argv = [sys.executable, "-m", "dmlctl", "launch", str(job_file), "--ui", "quiet"]
    if request.cluster_file is not None:
        argv += ["--cluster", str(request.cluster_file)]
    home = dmlctl_home()
    started = time.time()
    with open(out, "w+", encoding="utf-8") as sink:
        proc = subprocess.Popen(
            argv,
            env=bench_env(home),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        over_budget = _wait(proc, request.budget_s)
    output = out.read_text(encoding="utf-8", errors="replace")
    run_id = _run_id(output)
    wall = time.time() - started
    if run_id is None:
        return Outcome.failed(candidate, _last_line(output), wall)
    run = RunStore(home).get(run_id)
    return analyse(candidate, request.target, run.path, over_budget=over_budget)


def _wait(proc: subprocess.Popen[str], budget_s: float) -> bool:
    """Wait for ``proc`` up to ``budget_s``; past it, stop it as Ctrl-C would and
    return True. Ctrl-C here stops the candidate too, then propagates."""
    try:
        proc.wait(timeout=budget_s)
        return False
    except subprocess.TimeoutExpired:
        _stop(proc)
        return True
    except KeyboardInterrupt:
        _stop(proc)
        raise


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _run_id(output: str) -> str | None:
    """The run id ``--ui quiet`` prints first (``run <id>``), if the run started."""
    for line in output.splitlines():
        if line.startswith("run ") and len(line.split()) == 2:
            return line.split()[1]
    return None


def _last_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "the launch printed nothing"


def report_json(request: AdviseRequest, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Everything ``--json`` prints (see :mod:`dmlctl.bench.advise_report`)."""
    from dmlctl.bench.advise_report import rank, recommendation

    ranked = rank(outcomes, request.target)
    return {
        "job": str(request.job_file),
        "cluster": None if request.cluster_file is None else str(request.cluster_file),
        "target": str(request.target),
        "metric": request.target.metric,
        "budget_s": request.budget_s,
        "candidates": [json.loads(json.dumps(o.to_dict())) for o in ranked],
        "recommendation": recommendation(ranked, request.target),
    }
