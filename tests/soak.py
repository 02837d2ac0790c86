"""``python -m tests.soak``: many launches and in-place replacements beside CPU burners;
every run must end by itself, and every failure must have a named cause.

* ``--launches N``: ``dmlctl launch`` of the launch benchmark's 2-worker job;
* ``--replacements N``: runs of the asgd example with ``restart.mode: in_place``,
  each with its worker 1 killed by SIGKILL once it has logged; the run must end
  succeeded with one replacement;
* ``--ranks fresh|warm`` for both, ``--burners N`` processes spinning meanwhile;
* ``--lanes N``: N of those loops at once, each with its own ``DMLCTL_HOME`` (the
  counts are split between them), for a soak under more load in less time.

A run still going after ``--timeout`` seconds is a hang (its processes are killed);
a failed run whose ``state.json`` names no root cause is an unnamed failure. The
summary line counts both; the exit code is 1 when either is not 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TRIVIAL = REPO / "dmlctl" / "bench" / "trivial" / "job.yaml"
PS_EXAMPLE = REPO / "examples" / "parameter-server"
STOP = threading.Event()  # set by SIGTERM: the lanes end, their runs are killed
ACTIVE: set[subprocess.Popen[str]] = set()  # the runs going on now, one per lane


def _dmlctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "dmlctl", *args]


def _state(home: Path) -> dict[str, Any] | None:
    runs = sorted((home / "runs").glob("*/state.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(runs[-1].read_text()) if runs else None


def _outcome(proc: subprocess.Popen[str], home: Path, timeout: float) -> str:
    """``ok``, ``failed-named``, ``failed-unnamed`` or ``hang``."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return "hang"
    finally:
        ACTIVE.discard(proc)
    if proc.returncode == 0:
        return "ok"
    state = _state(home) or {}
    return "failed-named" if (state.get("root_cause") or {}).get("exc_type") else "failed-unnamed"


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _stop(*_: object) -> None:
    STOP.set()
    for proc in list(ACTIVE):
        _kill(proc)


def _start(home: Path, argv: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "DMLCTL_HOME": str(home)}
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    ACTIVE.add(proc)
    return proc


def _worker_pid(home: Path, rank: int, before: set[Path]) -> int | None:
    """The pid of ``rank``'s process of the run that is not in ``before``, once it has
    logged a metric."""
    runs = [p for p in (home / "runs").glob("*/hosts/local") if p not in before]
    path = runs[0] / f"rank-{rank}.events.jsonl" if runs else None
    if path is None or not path.exists():
        return None
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    starts = [r for r in records if r.get("kind") == "start"]
    logged = any(r.get("kind") == "metric" for r in records)
    return int(starts[-1]["pid"]) if starts and logged else None


class Tally:
    """Outcomes of one kind of run, counted by every lane and printed as they come."""

    def __init__(self, what: str, count: int) -> None:
        self.what, self.count = what, count
        self.seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, outcome: str) -> None:
        if STOP.is_set():  # killed by the soak's own end, not by itself
            return
        with self._lock:
            self.seen[outcome] += 1
            done = sum(self.seen.values())
            print(f"{self.what} {done}/{self.count}: {dict(self.seen)}", flush=True)


def launches(home: Path, count: int, ranks: str, timeout: float, tally: Tally) -> None:
    for _ in range(count):
        if STOP.is_set():
            return
        argv = _dmlctl("launch", str(TRIVIAL), "--ui", "quiet", "--ranks", ranks)
        tally.add(_outcome(_start(home, argv), home, timeout))


def replacements(home: Path, count: int, ranks: str, timeout: float, tally: Tally) -> None:
    job = home / "inplace.yaml"
    job.write_text(
        f"name: soak-inplace\nworkdir: {PS_EXAMPLE}\nscript: train.py\n"
        "args: ['--epochs', '3']\nworkers: 2\nparameter_servers: 1\nstrategy: asgd\n"
        "restart: {mode: in_place}\n"
    )
    for _ in range(count):
        if STOP.is_set():
            return
        before = set((home / "runs").glob("*/hosts/local"))
        proc = _start(home, _dmlctl("launch", str(job), "--ui", "quiet", "--ranks", ranks))
        deadline = time.monotonic() + timeout
        while (pid := _worker_pid(home, 1, before)) is None and time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):  # it ended first
                os.kill(pid, signal.SIGKILL)
        outcome = _outcome(proc, home, max(1.0, deadline - time.monotonic()))
        if outcome == "ok" and (_state(home) or {}).get("respawns") != 1:
            outcome = "ok-without-replacement"
        tally.add(outcome)


def _share(total: int, lanes: int, k: int) -> int:
    """Lane ``k``'s part of ``total`` runs."""
    return total // lanes + (k < total % lanes)


def lanes(args: argparse.Namespace, root: Path) -> Counter[str]:
    """Every lane's launches, then its replacements, each lane in its own home."""
    runs, swaps = Tally("launch", args.launches), Tally("replacement", args.replacements)

    def lane(k: int) -> None:
        home = root / f"lane-{k}"
        home.mkdir()
        launches(home, _share(args.launches, args.lanes, k), args.ranks, args.timeout, runs)
        count = _share(args.replacements, args.lanes, k)
        replacements(home, count, args.ranks, args.timeout, swaps)

    with ThreadPoolExecutor(args.lanes) as pool:
        list(pool.map(lane, range(args.lanes)))
    return runs.seen + swaps.seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, default=1000)
    parser.add_argument("--replacements", type=int, default=200)
    parser.add_argument("--ranks", choices=("fresh", "warm"), default="fresh")
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--lanes", type=int, default=1)
    args = parser.parse_args()
    # SIGTERM (or SIGINT, ignored in a shell's background job) ends the soak with its
    # runs and burners, saying what it had seen.
    signal.signal(signal.SIGTERM, _stop)
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)
    ]
    started = time.monotonic()
    seen: Counter[str] = Counter()
    try:
        with tempfile.TemporaryDirectory(prefix="dmlctl-soak-") as tmp:
            seen = lanes(args, Path(tmp))
    finally:
        for burner in burners:
            burner.kill()
    bad = seen["hang"] + seen["failed-unnamed"]
    took = time.monotonic() - started
    print(
        f"soak --ranks {args.ranks}{' (stopped)' if STOP.is_set() else ''}: {args.launches} "
        f"launches, {args.replacements} replacements in {args.lanes} lane(s) beside "
        f"{args.burners} burners in {took:.0f} s: {dict(seen)}; hangs {seen['hang']}, "
        f"failures without a named cause {seen['failed-unnamed']}"
    )
    return 1 if bad or STOP.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
