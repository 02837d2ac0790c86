"""What each ``bench advise`` candidate did, read from its run directory, and the
ranking, table and recommendation built from it (torch-free, pure apart from
:func:`analyse` reading the run's files).

From ``metrics.jsonl``: the target metric's records of the lowest rank that logs it
(so an all-reduced metric logged by every rank counts once) make the curve; the
**time to target** is the first record meeting the target, in seconds from the
launch (startup included, as a user waits for it); the **bytes to target** are the
bytes every rank had sent by then (the latest ``comm_bytes_total`` of each rank at
that moment, added). ``samples/s`` is the sum over ranks of each rank's median;
``comm share`` the mean over ranks of the last communication share.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.table import Table

from dmlctl.bench.advise_spec import Candidate, Target
from dmlctl.runs.state import RunState
from dmlctl.ui.numbers import compact_bytes, compact_rate

REACHED, NOT_REACHED, BUDGET, FAILED = "reached", "not reached", "budget", "failed"


@dataclass(frozen=True)
class Outcome:
    """One candidate's run: how it ended and what it logged (None: not known)."""

    candidate: Candidate
    status: str  # REACHED, NOT_REACHED (ended first), BUDGET (stopped first), FAILED
    run_id: str | None = None
    detail: str = ""
    wall_s: float | None = None
    time_to_target_s: float | None = None
    bytes_to_target: float | None = None
    final: float | None = None
    samples_per_s: float | None = None
    comm_share: float | None = None
    bytes_total: float | None = None
    curve: tuple[tuple[float, float, float], ...] = field(default=())
    """(seconds since launch, bytes sent by then, metric) per record of the metric."""

    @staticmethod
    def failed(candidate: Candidate, detail: str, wall_s: float) -> Outcome:
        """A candidate whose launch did not even start a run."""
        return Outcome(candidate, FAILED, detail=detail, wall_s=wall_s)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["label"] = self.candidate.label
        out["candidate"] = {
            "strategy": self.candidate.strategy,
            "params": dict(self.candidate.params),
            "servers": self.candidate.servers,
        }
        return out


@dataclass
class _Walk:
    """Running totals while reading a run's records in time order."""

    sent: dict[int, float] = field(default_factory=dict)
    last_share: dict[int, float] = field(default_factory=dict)
    rates: dict[int, list[float]] = field(default_factory=dict)
    curve: list[tuple[float, float, float]] = field(default_factory=list)


def _records(metrics: Path) -> Iterator[tuple[float, int, dict[str, Any]]]:
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return
    parsed = []
    for line in lines:
        try:
            rec = json.loads(line)
            parsed.append((float(rec["ts"]), int(rec["rank"]), dict(rec["values"])))
        except (ValueError, KeyError, TypeError):
            continue
    yield from sorted(parsed, key=lambda r: r[0])


def _number(value: object) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None  # type: ignore[arg-type]


def _walk(metrics: Path, metric: str, origin: float) -> _Walk:
    records = list(_records(metrics))
    loggers = [rank for _, rank, values in records if _number(values.get(metric)) is not None]
    curve_rank = min(loggers) if loggers else None
    walk = _Walk()
    for ts, rank, values in records:
        sent = _number(values.get("comm_bytes_total"))
        if sent is not None:
            walk.sent[rank] = sent
        seconds, wall = (
            _number(values.get("comm_seconds_total")),
            _number(values.get("comm_wall_total")),
        )
        if seconds is not None and wall:
            walk.last_share[rank] = seconds / wall
        rate = _number(values.get("samples_per_s"))
        if rate is not None:
            walk.rates.setdefault(rank, []).append(rate)
        value = _number(values.get(metric))
        if rank == curve_rank and value is not None:
            walk.curve.append((ts - origin, sum(walk.sent.values()), value))
    return walk


def target_reached(metrics: Path, target: Target) -> bool:
    """Whether any record of ``metrics`` has the target metric meeting ``target``."""
    for _, _, values in _records(metrics):
        value = _number(values.get(target.metric))
        if value is not None and target.reached(value):
            return True
    return False


def analyse(candidate: Candidate, target: Target, run_dir: Path, *, over_budget: bool) -> Outcome:
    """The outcome of the run in ``run_dir`` (see the module docstring)."""
    state = RunState.from_dict(json.loads((run_dir / "state.json").read_text(encoding="utf-8")))
    walk = _walk(run_dir / "metrics.jsonl", target.metric, state.created_at)
    hit = next((p for p in walk.curve if target.reached(p[2])), None)
    wall = (state.ended_at or state.created_at) - state.created_at
    if hit is not None:
        status = REACHED
    elif over_budget:
        status = BUDGET
    elif state.exit_code != 0:
        status = FAILED
    else:
        status = NOT_REACHED
    detail = ""
    if status == FAILED:
        cause = state.root_cause
        detail = cause.headline() if cause is not None else f"exit code {state.exit_code}"
    rates = [statistics.median(r) for r in walk.rates.values() if r]
    shares = list(walk.last_share.values())
    return Outcome(
        candidate,
        status,
        run_id=state.run_id,
        detail=detail,
        wall_s=wall,
        time_to_target_s=None if hit is None else hit[0],
        bytes_to_target=None if hit is None else hit[1],
        final=walk.curve[-1][2] if walk.curve else None,
        samples_per_s=sum(rates) if rates else None,
        comm_share=statistics.fmean(shares) if shares else None,
        bytes_total=sum(walk.sent.values()) if walk.sent else None,
        curve=tuple(walk.curve),
    )


def rank(outcomes: Sequence[Outcome], target: Target) -> list[Outcome]:
    """Best first: those that reached the target by time to it, then the rest by
    their final metric (closest to the target first), failed runs last."""

    def key(o: Outcome) -> tuple[int, float]:
        if o.status == REACHED and o.time_to_target_s is not None:
            return (0, o.time_to_target_s)
        if o.status != FAILED and o.final is not None:
            return (1, -o.final if target.higher_is_better else o.final)
        return (2, 0.0)

    return sorted(outcomes, key=key)


def snippet(candidate: Candidate) -> str:
    """The job-file lines that apply ``candidate``."""
    block: dict[str, Any] = {"strategy": candidate.strategy_block()}
    if not candidate.params:
        block["strategy"] = {"name": candidate.strategy}
    if candidate.servers:
        block["parameter_servers"] = candidate.servers
    return yaml.safe_dump(block, sort_keys=False).rstrip()


def recommendation(ranked: Sequence[Outcome], target: Target) -> dict[str, Any] | None:
    """The first candidate that reached the target, why, and its job-file snippet;
    None when none did."""
    best = next((o for o in ranked if o.status == REACHED), None)
    if best is None or best.time_to_target_s is None:
        return None
    why = f"reached {target} in {best.time_to_target_s:.1f} s"
    ref = next((o for o in ranked if o.candidate == Candidate("ssgd") and o is not best), None)
    if ref is not None and ref.status == REACHED and ref.time_to_target_s:
        why += f", {ref.time_to_target_s / best.time_to_target_s:.1f}× sooner than ssgd"
        if best.bytes_to_target and ref.bytes_to_target:
            ratio = ref.bytes_to_target / best.bytes_to_target
            why += f" with {ratio:.1f}× fewer bytes sent"
    return {"label": best.candidate.label, "why": why, "snippet": snippet(best.candidate)}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render_advice_table(report: dict[str, Any]) -> Table:
    """One row per candidate, best first (the ``--json`` report's ``candidates``);
    why a run failed and which run each row is come below it (:func:`advice_notes`)."""
    table = Table(
        title=f"{report['name']}: seconds and bytes sent to {report['target']} "
        f"(budget {report['budget_s']:g} s per candidate)",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("#", justify="right", no_wrap=True, min_width=1)
    table.add_column("strategy", min_width=12, overflow="fold")  # wraps; the numbers never do
    for name in ("outcome", "seconds", "sent", "final", "samples/s", "comm %"):
        table.add_column(
            name,
            justify="left" if name == "outcome" else "right",
            no_wrap=True,
            min_width=len(name),
        )
    for i, row in enumerate(report["candidates"], 1):
        share = row["comm_share"]
        table.add_row(
            str(i),
            row["label"],
            row["status"],
            _seconds(row["time_to_target_s"]),
            compact_bytes(row["bytes_to_target"]),
            "-" if row["final"] is None else f"{row['final']:.4g}",
            compact_rate(row["samples_per_s"]),
            "-" if share is None else f"{100 * share:.0f}%",
        )
    return table


def advice_notes(report: dict[str, Any]) -> list[str]:
    """Under the table: each row's run (``dmlctl logs`` takes it), with why it failed."""
    lines = []
    for i, row in enumerate(report["candidates"], 1):
        why = f" failed: {row['detail']}" if row["status"] == FAILED else ""
        lines.append(f"{i}. {row['label']}: run {row['run_id'] or '(none started)'}{why}")
    return lines


def moves_table(report: dict[str, Any]) -> Table:
    """Rows: candidates; columns: scenarios; cells: the place and the time to target
    there (``-`` where it did not get there) — how the ranking moves."""
    scenarios = report["scenarios"]
    table = Table(
        title=f"place and seconds to {report['target']} by scenario",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("strategy")
    for scenario in scenarios:
        table.add_column(scenario["name"], justify="right")
    labels = list(dict.fromkeys(r["label"] for s in scenarios for r in s["candidates"]))
    for label in labels:
        cells = []
        for scenario in scenarios:
            rows = scenario["candidates"]
            at = next((i for i, r in enumerate(rows, 1) if r["label"] == label), None)
            row = rows[at - 1] if at is not None else None
            seconds = None if row is None else row["time_to_target_s"]
            cells.append("-" if at is None else f"#{at}  {_seconds(seconds)}")
        table.add_row(label, *cells)
    return table
