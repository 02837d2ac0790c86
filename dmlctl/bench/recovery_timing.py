"""Timings of one recovery, read back after the run: the benchmark script's timing
lines, torchrun's log lines and, for dmlctl, the run directory; from them the
recovery time, the steps lost and when each stage of the recovery ended
(:data:`STAGES`, seconds after the kill). See :mod:`dmlctl.bench.recovery`. Also
what every side's run of the recovery job shares: its directory, the rank killed,
the sleep per step, its arguments, this machine as its cluster. Never imports torch.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlctl.errors import DmlctlError, UsageError
from dmlctl.failure import Evidence, failure_from_dict
from dmlctl.plan.model import attempt_rank_dir
from dmlctl.protocol import KIND_START, rank_events
from dmlctl.runs.store import RunDir
from dmlctl.spec import ClusterSpec, HostSpec
from dmlctl.spec.cluster import LOCAL_ADDRESS

KILL_RANK = 1  # the rank that writes the kill line and kills itself
JOB_DIR = Path(__file__).resolve().parent / "recovery_job"
"""The recovery job's workdir: ``train.py`` for the restarted sides, ``train_ps.py`` for
the in-place one (one tiny model, a sleep per step)."""
STEP_SLEEP_S = 0.05
"""Seconds each step of the recovery job sleeps (its model computes next to nothing)."""


def script_argv(options: Mapping[str, object]) -> list[str]:
    """``options`` (``{"--steps": 150, …}``) as a job script's arguments, in their order:
    each option, then its value as text."""
    return [str(part) for option in options.items() for part in option]


def local_cluster(slots: int) -> ClusterSpec:
    """This machine as host ``local`` with ``slots`` slots, whatever its cores."""
    return ClusterSpec(hosts=[HostSpec(name="local", address=LOCAL_ADDRESS, slots=slots)])


class RecoveryBenchFailed(DmlctlError):
    """A dmlctl run failed or did not restart exactly once, or a run's timing files
    lack the kill or the restart; the message says which."""


STAGES: tuple[tuple[str, str], ...] = (
    ("detected", "torchrun saw the kill (SIGTERM to the other workers)"),
    ("workers_stopped", "torchrun logged the failure (old workers gone)"),
    ("controller_notified", "controller recorded the failure (torchrun, agent exited)"),
    ("agent_started", "new host agent running (after the backoff)"),
    ("rank_started", "new rank process started (torchrun, rendezvous, spawn)"),
    ("script_started", "script started"),
    ("torch_imported", "torch imported"),
    ("joined", "process group initialised"),
    ("built", "model and optimizer built"),
    ("resumed", "checkpoint loaded"),
    ("first_step", "first step completed (= recovery)"),
)
"""Stages of a recovery in the order they end: (key, meaning). The dmlctl-only
stages are ``controller_notified``, ``agent_started`` and ``rank_started``."""

_SCRIPT_STAGES = {
    "start": "script_started",
    "imported": "torch_imported",
    "joined": "joined",
    "built": "built",
    "resumed_from": "resumed",
}
_TORCHRUN_STAGES = {"closing signal": "detected", "failed (exitcode": "workers_stopped"}
# torchrun's log prefix: level, MMDD HH:MM:SS.micro (local time), pid.
_GLOG = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(\.\d+) +\d+ ")


@dataclass(frozen=True)
class TimingRecord:
    """One line of a rank's timing file: ``KIND STEP TIME ATTEMPT`` (see the script)."""

    rank: int
    kind: str
    step: int
    time: float
    attempt: int


def parse_timing(lines: Iterable[str], rank: int) -> list[TimingRecord]:
    """The records of rank ``rank``'s timing file, in file order.

    Blank and malformed lines (a line torn by a kill, anything else) are skipped.
    """
    out: list[TimingRecord] = []
    for line in lines:
        parts = line.split()
        if len(parts) != 4:
            continue
        try:
            out.append(TimingRecord(rank, parts[0], int(parts[1]), float(parts[2]), int(parts[3])))
        except ValueError:
            continue
    return out


def read_timing_dir(directory: Path) -> list[TimingRecord]:
    """Every ``rank-<R>.timing`` file in ``directory``, parsed (none: empty list)."""
    records: list[TimingRecord] = []
    for path in sorted(directory.glob("rank-*.timing")):
        rank = path.name[len("rank-") : -len(".timing")]
        if rank.isdigit():
            with open(path, encoding="ascii", errors="replace") as f:
                records += parse_timing(f, int(rank))
    return records


@dataclass(frozen=True)
class Recovery:
    """One failure and restart on one side (times: ``time.time()`` seconds).

    ``stages`` maps the keys of :data:`STAGES` that were observed to the seconds
    after the kill at which they ended.
    """

    kill_time: float
    first_step_time: float
    steps_done: int
    resumed_from: int
    stages: Mapping[str, float] = field(default_factory=dict)
    cause: str = ""  # what the launcher recorded as the failure (dmlctl: its root cause)
    survivor_rate: float | None = None  # in place: the others' steps/s after ÷ before

    @property
    def seconds(self) -> float:
        """Recovery time: first step after the restart − kill."""
        return self.first_step_time - self.kill_time

    @property
    def steps_lost(self) -> int:
        """Steps done before the kill that the restart had to do again."""
        return max(0, self.steps_done - self.resumed_from)

    @property
    def steps_skipped(self) -> int:
        """Steps the restart went on beyond the kill's (an in-place replacement of an
        averaging strategy joins its peers at their round: the batches in between
        are not seen)."""
        return max(0, self.resumed_from - self.steps_done)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with ``recovery_s`` and ``steps_lost``."""
        return {
            "recovery_s": self.seconds,
            "kill_time": self.kill_time,
            "first_step_time": self.first_step_time,
            "steps_done": self.steps_done,
            "resumed_from": self.resumed_from,
            "steps_lost": self.steps_lost,
            "steps_skipped": self.steps_skipped,
            "stages_s": dict(self.stages),
            "cause": self.cause,
            **({} if self.survivor_rate is None else {"survivor_rate": self.survivor_rate}),
        }


def measure_recovery(
    records: Sequence[TimingRecord],
    *,
    killed_rank: int = KILL_RANK,
    launcher_times: Mapping[str, float] | None = None,
    in_place: bool = False,
) -> Recovery:
    """The recovery in ``records`` (every rank's timing lines of one run).

    The kill is ``killed_rank``'s ``kill`` record; the restart is the first later
    attempt in which ``killed_rank`` completed a step (``in_place``: its replacement,
    which counts as one). ``steps_done`` is the highest step any rank completed in
    the killed attempt (``in_place``: the killed rank's, the others went on), and
    ``in_place`` also measures the others' :func:`survivor_rate`; ``resumed_from``
    is ``killed_rank``'s ``resumed_from`` in the restart. Stages come from the killed
    rank's records of the restart plus ``launcher_times`` (absolute times keyed by
    :data:`STAGES` keys). Raises :class:`RecoveryBenchFailed` naming what is missing.
    """
    kills = [r for r in records if r.rank == killed_rank and r.kind == "kill"]
    if not kills:
        raise RecoveryBenchFailed(f"rank {killed_rank} recorded no kill")
    kill = kills[0]
    restart = [r for r in records if r.rank == killed_rank and r.attempt > kill.attempt]
    steps = [r for r in restart if r.kind == "step"]
    if not steps:
        raise RecoveryBenchFailed(f"rank {killed_rank} completed no step after the restart")
    attempt = min(r.attempt for r in steps)
    mine = [r for r in restart if r.attempt == attempt]
    resumed = [r for r in mine if r.kind == "resumed_from"]
    if not resumed:
        raise RecoveryBenchFailed(
            f"rank {killed_rank} did not record where attempt {attempt} resumed from"
        )
    first = next(r for r in mine if r.kind == "step")
    done = max(
        (r.step for r in records if r.kind == "step" and r.attempt == kill.attempt), default=0
    )
    times = {stage: r.time for r in reversed(mine) if (stage := _SCRIPT_STAGES.get(r.kind))}
    times.update(launcher_times or {}, first_step=first.time)
    stages = {key: times[key] - kill.time for key, _ in STAGES if key in times}
    if in_place:
        rate = survivor_rate(records, kill)
        return Recovery(kill.time, first.time, kill.step, resumed[0].step, stages, "", rate)
    return Recovery(kill.time, first.time, done, resumed[0].step, stages)


SURVIVOR_WINDOW_S = 10.0
"""The seconds before and after a kill over which :func:`survivor_rate` counts."""


def survivor_rate(
    records: Sequence[TimingRecord], kill: TimingRecord, window: float = SURVIVOR_WINDOW_S
) -> float | None:
    """The steps per second the other ranks completed in the ``window`` seconds after
    ``kill`` ÷ in the ``window`` seconds before it (each window cut to the steps they
    have on that side); None when either side has no steps."""
    times = [r.time for r in records if r.kind == "step" and r.rank != kill.rank]
    if not times:
        return None
    before = min(window, kill.time - min(times))
    after = min(window, max(times) - kill.time)
    if before <= 0 or after <= 0:
        return None
    n_before = sum(kill.time - before < t <= kill.time for t in times)
    n_after = sum(kill.time < t <= kill.time + after for t in times)
    return (n_after / after) / (n_before / before) if n_before else None


def _glog_time(line: str, near: float) -> float | None:
    """The time in a torchrun log line's prefix (local time, no year: the year that
    puts it nearest to ``near``), or None for a line without one."""
    m = _GLOG.match(line)
    if m is None:
        return None
    month, day, hour, minute, second = (int(g) for g in m.groups()[:5])
    year = time.localtime(near).tm_year
    stamps = [
        time.mktime((y, month, day, hour, minute, second, 0, 0, -1)) + float(m.group(6))
        for y in (year - 1, year, year + 1)
    ]
    return min(stamps, key=lambda t: abs(t - near))


def torchrun_times(lines: Iterable[str], now: float | None = None) -> dict[str, float]:
    """Absolute times of torchrun's first "closing signal" line (``detected``: it
    saw a worker fail and signals the others) and first "failed (exitcode" line
    (``workers_stopped``). ``now`` (default: the clock) picks the year."""
    near = time.time() if now is None else now
    out: dict[str, float] = {}
    for line in lines:
        for marker, stage in _TORCHRUN_STAGES.items():
            if stage not in out and marker in line and (t := _glog_time(line, near)) is not None:
                out[stage] = t
    return out


def _known_by_exit_status(data: Mapping[str, Any]) -> bool:
    """Whether a recorded failure was known from an exit status alone (an older
    record's evidence comes from its names); False for one that cannot be read."""
    try:
        return failure_from_dict(data).evidence is Evidence.EXIT
    except (KeyError, TypeError, ValueError):
        return False


def dmlctl_times(run_dir: Path, *, rank: int = KILL_RANK, attempt: int = 1) -> dict[str, float]:
    """Absolute times of the dmlctl-side stages of attempt ``attempt`` in ``run_dir``:
    torchrun's log lines (``logs/agent-*.log``), ``controller_notified`` (the first
    failure in ``state.json``, when its cause was made on the controller's clock
    from torchrun's summary or the agent's exit, not from a rank's own record),
    ``agent_started`` (the new agent's ``agent.pid``) and ``rank_started``
    (``rank``'s ``start`` record). A stage whose file is missing is left out."""
    out: dict[str, float] = {}
    for log in sorted((run_dir / "logs").glob("agent-*.log")):
        with open(log, encoding="utf-8", errors="replace") as f:
            out = {**torchrun_times(f), **out}
    try:
        state = json.loads((run_dir / "state.json").read_text(encoding="utf-8"))
        plan = RunDir(run_dir).read_plan()
    except (OSError, ValueError, KeyError, UsageError):
        return out
    cause = next(iter(state.get("failures", ())), None)
    # A cause known from an exit status alone (parser.torchrun_failure, reducer.apply) is
    # stamped with the controller's clock when the agent's exit arrives.
    if cause and _known_by_exit_status(cause):
        out["controller_notified"] = float(cause["ts"])
    host = next((h for h in plan.hosts if h.first_rank <= rank < h.first_rank + h.nproc), None)
    if host is None:
        return out
    rank_dir = Path(attempt_rank_dir(host.rank_dir, attempt))
    try:
        out["agent_started"] = (rank_dir / "agent.pid").stat().st_mtime
        with open(rank_events(str(rank_dir), rank), encoding="utf-8") as f:
            start = next(rec for line in f if (rec := json.loads(line))["kind"] == KIND_START)
        out["rank_started"] = float(start["ts"])
    except (OSError, ValueError, KeyError, StopIteration):
        pass
    return out
