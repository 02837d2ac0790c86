"""``dmlctl bench advise``: run the user's own job once per candidate strategy and
read from what it logged when each reached the target, at what traffic.

Each candidate is an ordinary ``dmlctl launch --ui quiet`` of a copy of the job file
whose ``strategy`` (and ``parameter_servers``, for the strategies that have them)
is the candidate's — same script, arguments, seed and data — in the user's
``DMLCTL_HOME``, so every run shows in ``dmlctl status``. A run still going when the
budget is spent, or once it logged a value meeting the target (unless
``run_to_end``), is stopped as Ctrl-C would (its ranks get their grace period). A
candidate whose run fails is reported as failed and the next one runs. Never imports
torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dmlctl.bench.advise_report import Outcome, analyse, rank, recommendation, target_reached
from dmlctl.bench.advise_spec import Candidate, Scenario, Target
from dmlctl.bench.proc import bench_env
from dmlctl.protocol import ENV_STRAGGLER
from dmlctl.runs.store import RunStore, dmlctl_home
from dmlctl.spec.loader import load_job
from dmlctl.spec.models import JobSpec
from dmlctl.ui.format import format_duration

STOP_GRACE_S = 60.0
"""Seconds a stopped candidate's launch gets to tear its run down before it is killed."""

POLL_S = 1.0
"""How often a running candidate's metrics are read for the target."""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class AdviseRequest:
    """One ``bench advise`` invocation, validated."""

    job_file: Path
    job: JobSpec
    candidates: Sequence[Candidate]
    target: Target
    budget_s: float
    scenarios: Sequence[Scenario]
    run_to_end: bool = False
    """Keep a candidate running after it reached the target (default: stop it there)."""


def candidate_job(
    request: AdviseRequest, candidate: Candidate, scenario: Scenario
) -> dict[str, Any]:
    """The user's job file as a mapping, with the candidate's strategy, servers and a
    name saying which strategy it runs (``<job>-<strategy>``); ``workdir`` absolute
    (the copy lives elsewhere); the scenario's straggler in ``env``; a
    ``checkpoint.dir`` of the job's own gets ``/{run_id}`` added, so no candidate
    resumes from another's checkpoint (a run would refuse it: CheckpointForeign)."""
    raw = yaml.safe_load(request.job_file.read_text(encoding="utf-8")) or {}
    checkpoint = raw.get("checkpoint")
    where = str(checkpoint.get("dir") or "") if isinstance(checkpoint, dict) else ""
    if where and "{run_id}" not in where:
        raw["checkpoint"] = {**raw["checkpoint"], "dir": f"{where}/{{run_id}}"}
    raw["name"] = f"{request.job.name}-{candidate.strategy}"
    raw["strategy"] = candidate.strategy_block()
    raw["parameter_servers"] = candidate.servers
    if not candidate.servers:
        raw.pop("server_hosts", None)
    raw["workdir"] = request.job.workdir
    raw["script"] = request.job.script
    if scenario.straggler > 1:
        raw["env"] = {**(raw.get("env") or {}), ENV_STRAGGLER: f"{scenario.straggler:g}"}
    return dict(raw)


def run_scenario(request: AdviseRequest, scenario: Scenario, progress: Progress) -> list[Outcome]:
    """Every candidate in turn on ``scenario``'s cluster (a lab made for it and
    removed after), each to its end or the budget; outcomes in the candidates' order."""
    with _cluster(request, scenario, progress) as cluster_file:
        return _run_candidates(request, scenario, cluster_file, progress)


@contextlib.contextmanager
def _cluster(
    request: AdviseRequest, scenario: Scenario, progress: Progress
) -> Iterator[Path | None]:
    if scenario.lab_bandwidth is None:
        yield scenario.cluster_file
        return
    from dmlctl.lab import lab_network

    hosts = (request.job.workers or os.cpu_count() or 2) + max(
        (c.servers for c in request.candidates), default=0
    )
    progress(f"{scenario.name}: making a lab of {hosts} hosts")
    with lab_network(hosts, scenario.lab_bandwidth, progress) as cluster_file:
        yield cluster_file


def _run_candidates(
    request: AdviseRequest, scenario: Scenario, cluster_file: Path | None, progress: Progress
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="dmlctl-advise-") as tmp:
        for i, candidate in enumerate(request.candidates, 1):
            progress(f"{scenario.name}: {i}/{len(request.candidates)} {candidate.label}")
            job_file = Path(tmp) / f"candidate-{i}.yaml"
            job_file.write_text(yaml.safe_dump(candidate_job(request, candidate, scenario)))
            load_job(job_file)  # the copy is valid when the user's file is
            out = Path(tmp) / f"launch-{i}.out"
            outcomes.append(_run_one(request, candidate, job_file, cluster_file, out))
    return outcomes


def _run_one(
    request: AdviseRequest, candidate: Candidate, job_file: Path, cluster: Path | None, out: Path
) -> Outcome:
    """Launch ``job_file`` (its output to ``out``), wait up to the budget, analyse."""
    argv = [sys.executable, "-m", "dmlctl", "launch", str(job_file), "--ui", "quiet"]
    if cluster is not None:
        argv += ["--cluster", str(cluster)]
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
        reached = None if request.run_to_end else _target_check(out, home, request.target)
        over_budget = _wait(proc, request.budget_s, reached)
    output = out.read_text(encoding="utf-8", errors="replace")
    run_id = _run_id(output)
    wall = time.time() - started
    if run_id is None:
        return Outcome.failed(candidate, _last_line(output), wall)
    run = RunStore(home).get(run_id)
    return analyse(candidate, request.target, run.path, over_budget=over_budget)


def _target_check(out: Path, home: Path, target: Target) -> Callable[[], bool]:
    """Whether the run that the launch writing ``out`` started has logged a record
    meeting ``target`` yet (False before it printed its run id)."""

    def reached() -> bool:
        run_id = _run_id(out.read_text(encoding="utf-8", errors="replace"))
        if run_id is None:
            return False
        metrics = home / "runs" / run_id / "metrics.jsonl"
        return target_reached(metrics, target)

    return reached


def _wait(proc: subprocess.Popen[str], budget_s: float, reached: Callable[[], bool] | None) -> bool:
    """Wait for ``proc`` up to ``budget_s``, checking ``reached`` every
    :data:`POLL_S`; once it holds, or past the budget, stop ``proc`` as Ctrl-C
    would. True when the budget stopped it. Ctrl-C here stops the candidate too,
    then propagates."""
    deadline = time.monotonic() + budget_s
    try:
        while proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                _stop(proc)
                return True
            if reached is not None and reached():
                _stop(proc)
                return False
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=min(POLL_S, left))
        return False
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


def scenario_json(
    request: AdviseRequest, scenario: Scenario, outcomes: Sequence[Outcome]
) -> dict[str, Any]:
    """One scenario of the ``--json`` report: its candidates best first and the
    recommendation (see :mod:`dmlctl.bench.advise_report`)."""
    ranked = rank(outcomes, request.target)
    cluster = scenario.cluster_file
    return {
        "name": scenario.name,
        "cluster": None if cluster is None else str(cluster),
        "lab_bandwidth": scenario.lab_bandwidth,
        "straggler": scenario.straggler,
        "target": str(request.target),
        "metric": request.target.metric,
        "budget_s": request.budget_s,
        "candidates": [json.loads(json.dumps(o.to_dict())) for o in ranked],
        "recommendation": recommendation(ranked, request.target),
    }


def planned(request: AdviseRequest) -> str:
    """What the bench is about to do and the most it may take: ``10 runs (5
    candidates × 2 scenarios) of at most 10m each: up to 1:40:00``."""
    runs = len(request.candidates) * len(request.scenarios)
    budget = request.budget_s
    each = f"{budget / 60:g}m" if budget % 60 == 0 else f"{budget:g}s"
    return (
        f"{runs} run{'s' * (runs != 1)} ({len(request.candidates)} candidates × "
        f"{len(request.scenarios)} scenario{'s' * (len(request.scenarios) != 1)}) of at "
        f"most {each} each: up to {format_duration(runs * budget)}, less where a "
        "candidate reaches the target sooner"
    )


def run_advice(request: AdviseRequest, progress: Progress) -> dict[str, Any]:
    """Every scenario in turn; everything ``--json`` prints."""
    scenarios = [
        scenario_json(request, s, run_scenario(request, s, progress)) for s in request.scenarios
    ]
    return {
        "job": str(request.job_file),
        "target": str(request.target),
        "metric": request.target.metric,
        "budget_s": request.budget_s,
        "scenarios": scenarios,
    }


def save_advice(report: dict[str, Any], path: Path) -> str | None:
    """Write the first scenario's recommendation to ``path`` as an advice file for
    ``strategy: {name: auto, advice: FILE}`` (:mod:`dmlctl.spec.advice`); what was
    saved, or None (nothing written) when no candidate reached the target there."""
    scenario = report["scenarios"][0]
    best = scenario["recommendation"]
    if best is None:
        return None
    row = next(r for r in scenario["candidates"] if r["label"] == best["label"])
    candidate = row["candidate"]
    doc = {
        "target": report["target"],
        "scenario": scenario["name"],
        "why": best["why"],
        "strategy": {"name": candidate["strategy"], "params": candidate["params"]},
        "parameter_servers": candidate["servers"],
        "run_id": row["run_id"],
    }
    head = "# Written by `dmlctl bench advise --save`; a job uses it with\n"
    head += f"#   strategy: {{name: auto, advice: {path.name}}}\n"
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return str(best["label"])
