"""The run directory store: ``$DMLCTL_HOME/runs/<run-id>/``.

Layout of one run directory::

    specs/            job.yaml, cluster.yaml as used (copied before anything starts)
    plan.json         the launch plan
    state.json        the latest RunState (written atomically: tmp file + rename)
    logs/rank-N.log   every line of rank N, in order
    logs/merged.log   every line of every rank, "[rank N] " prefixed, in arrival order
    logs/agent-H.log  what host H's agent and torchrun printed
    metrics.jsonl     one metric record per line: {ts, host, rank, step, values}
    stacks/rank-N.txt every thread's stack of rank N, dumped when a hang was detected
    summary.json      the final state, written once when the run ends
    controller.pid    pid of the controller process while it runs
    controller.log    a detached controller's own output
    hosts/<host>/     rank files of local hosts (see dmlctl.protocol)

``status``, ``logs`` and ``stop`` read only these files.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dmlctl.errors import RunNotFound, UsageError
from dmlctl.launch.state import Phase, RunState


def dmlctl_home() -> Path:
    """``$DMLCTL_HOME``, default ``~/.dmlctl``."""
    return Path(os.environ.get("DMLCTL_HOME") or Path.home() / ".dmlctl").expanduser()


def new_run_id(job_name: str, now: float) -> str:
    """``<job>-<YYYYmmdd-HHMMSS>-<4 hex>``: sortable, readable, unique enough."""
    slug = re.sub(r"[^a-z0-9]+", "-", job_name.lower()).strip("-")[:24] or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{slug}-{stamp}-{secrets.token_hex(2)}"


_STAMP = re.compile(r"(\d{8}-\d{6})-[0-9a-f]{4}$")


def _started_key(path: Path) -> tuple[str, float, str]:
    """Sort key: the time stamp in the run id, else the state file's age."""
    m = _STAMP.search(path.name)
    if m:
        return (m.group(1), 0.0, path.name)
    return ("", (path / "state.json").stat().st_mtime, path.name)


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def pid_alive(pid: int) -> bool:
    """True if a process with ``pid`` exists (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        return True


class RunDir:
    """One run's directory and the files in it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.run_id = path.name

    @property
    def specs(self) -> Path:
        return self.path / "specs"

    @property
    def plan(self) -> Path:
        return self.path / "plan.json"

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def stacks(self) -> Path:
        """``stacks/rank-N.txt``: every thread's stack, dumped on each hang verdict."""
        return self.path / "stacks"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def controller_pid(self) -> Path:
        return self.path / "controller.pid"

    @property
    def controller_log(self) -> Path:
        return self.path / "controller.log"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    def write_state(self, state: RunState) -> None:
        """Persist ``state`` atomically to ``state.json``."""
        atomic_write(self.state_file, json.dumps(state.to_dict(), indent=1))

    def write_summary(self, state: RunState) -> None:
        atomic_write(self.summary, json.dumps(state.to_dict(), indent=1))

    def read_state(self) -> RunState:
        """The last persisted state; ``lost`` when the run is not final and its
        controller is gone."""
        try:
            state = RunState.from_dict(json.loads(self.state_file.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError) as e:
            raise UsageError(f"{self.state_file}: unreadable run state ({e})") from None
        if not state.phase.terminal and not self.controller_alive():
            from dataclasses import replace

            state = replace(state, phase=Phase.LOST, detail="controller is gone")
        return state

    def controller(self) -> int | None:
        """The controller's pid, if recorded."""
        try:
            return int(self.controller_pid.read_text().strip())
        except (OSError, ValueError):
            return None

    def controller_alive(self) -> bool:
        pid = self.controller()
        return pid is not None and pid_alive(pid)

    def write_json(self, path: Path, data: Any) -> None:
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True))


class RunStore:
    """All runs under ``home/runs``."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home if home is not None else dmlctl_home()
        self.root = self.home / "runs"

    def create(self, run_id: str) -> RunDir:
        """Make a new, empty run directory (with specs/ and logs/)."""
        run = RunDir(self.root / run_id)
        self.root.mkdir(parents=True, exist_ok=True)
        # Private: plan.json holds the job's environment, which may carry secrets.
        run.path.mkdir(mode=0o700)
        (run.path / "logs").mkdir()
        run.specs.mkdir()
        return run

    def runs(self) -> Iterator[RunDir]:
        """Every run that has a state file, oldest first (by the time in its id)."""
        if not self.root.is_dir():
            return
        paths = [p for p in self.root.iterdir() if (p / "state.json").is_file()]
        yield from (RunDir(p) for p in sorted(paths, key=_started_key))

    def get(self, run_id: str) -> RunDir:
        """The run whose id is ``run_id`` or starts with it (must be unambiguous);
        ``last`` names the newest run."""
        runs = list(self.runs())
        if run_id == "last" and runs:
            return max(runs, key=lambda r: r.state_file.stat().st_mtime)
        exact = [r for r in runs if r.run_id == run_id]
        if exact:
            return exact[0]
        matches = [r for r in runs if r.run_id.startswith(run_id)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            ids = ", ".join(r.run_id for r in matches[:5])
            raise UsageError(f"run id {run_id!r} is ambiguous: {ids}")
        raise RunNotFound(f"no run {run_id!r} in {self.root} (see 'dmlctl status')")
