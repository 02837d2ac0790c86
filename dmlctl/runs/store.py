"""The run directory store: ``$DMLCTL_HOME/runs/<run-id>/``.

Layout of one run directory::

    specs/            job.yaml, cluster.yaml as used, env values redacted (written
                      before anything starts)
    plan.json         the launch plan, env values redacted
    secrets.json      the real env values of the job and cluster (0600; the
                      controller reads it; see dmlctl.runs.secrets)
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

``status``, ``logs`` and ``stop`` read only these files. Every file is 0600 and every
folder 0700 (:mod:`dmlctl.runs.files`); each run is read on its own, so one broken
run never hides the others (:meth:`RunStore.listing`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dmlctl.errors import RunNotFound, UsageError
from dmlctl.private_files import file_in_the_way
from dmlctl.runs import secrets as run_secrets
from dmlctl.runs.files import (
    DIR_MODE,
    Reserve,
    RunDirGone,
    atomic_write,
    make_private_dir,
    store_error,
)
from dmlctl.runs.pids import RecordedProcess
from dmlctl.runs.state import RunState

if TYPE_CHECKING:
    from dmlctl.plan.model import LaunchPlan

__all__ = [
    "RunDir",
    "RunListing",
    "RunStore",
    "RunUnreadable",
    "atomic_write",
    "check_home",
    "dmlctl_home",
    "new_run_id",
]


def dmlctl_home() -> Path:
    """``$DMLCTL_HOME``, default ``~/.dmlctl``."""
    return Path(os.environ.get("DMLCTL_HOME") or Path.home() / ".dmlctl").expanduser()


def check_home() -> None:
    """:class:`~dmlctl.errors.UsageError` (exit 2) when :func:`dmlctl_home` cannot be a
    directory: a file stands where it, or a folder above it, must be."""
    home = dmlctl_home()
    if (problem := file_in_the_way(str(home))) is not None:
        named = "DMLCTL_HOME" if os.environ.get("DMLCTL_HOME") else "dmlctl's home (~/.dmlctl)"
        raise UsageError(f"{named}: {problem}")


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
    try:
        return ("", (path / "state.json").stat().st_mtime, path.name)
    except OSError:
        return ("", 0.0, path.name)


def _mtime(run: RunDir) -> float:
    try:
        return run.state_file.stat().st_mtime
    except OSError:
        return 0.0


class RunUnreadable(UsageError):
    """A run's ``state.json`` cannot be read or makes no sense; ``reason`` says why."""

    def __init__(self, run_id: str, reason: str) -> None:
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"run {run_id}: state unreadable ({reason})")


@dataclass(frozen=True)
class RunListing:
    """One run of :meth:`RunStore.listing`: its state, or why it cannot be read."""

    run_id: str
    state: RunState | None
    error: str | None = None


class RunDir:
    """One run's directory and the files in it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.run_id = path.name
        self._ino: int | None = None  # the directory's inode, once checked

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

    @property
    def secrets(self) -> Path:
        """``secrets.json``: the real env values (0600), see :mod:`dmlctl.runs.secrets`."""
        return self.path / "secrets.json"

    @property
    def reserve(self) -> Reserve:
        """Space kept aside while the run runs (:class:`dmlctl.runs.files.Reserve`)."""
        return Reserve(self.path / ".reserve")

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    def write_state(self, state: RunState) -> None:
        """Persist ``state`` atomically to ``state.json`` (StoreError on failure)."""
        self.write_text(self.state_file, _state_json(state))

    def write_summary(self, state: RunState) -> None:
        self.write_text(self.summary, _state_json(state))

    def write_final_in_reserve(self, state: RunState) -> None:
        """``state`` as ``state.json`` and ``summary.json`` on a full disk: written into
        the reserve's own blocks, the summary a hard link to it (no free space needed).
        StoreError when there is no reserve left to write into."""
        try:
            self.reserve.put(self.state_file, _state_json(state))
        except OSError as e:
            raise store_error(e, self.state_file, self.path) from None
        with contextlib.suppress(OSError):  # the summary is the same final state
            self.summary.unlink(missing_ok=True)
            os.link(self.state_file, self.summary)

    def write_text(self, path: Path, text: str) -> None:
        """``text`` into ``path`` of this run, atomically, mode 0600; a failure raises
        :class:`~dmlctl.runs.files.StoreError` (DiskFull, RunDirGone …)."""
        try:
            atomic_write(path, text)
        except OSError as e:
            raise store_error(e, path, self.path) from None

    def write_pid(self, pid: int) -> None:
        """Record the controller: its pid and start time (:mod:`~dmlctl.runs.pids`)."""
        self.write_text(self.controller_pid, RecordedProcess.of(pid).dumps())

    def check_present(self) -> None:
        """:class:`~dmlctl.runs.files.RunDirGone` when the run directory is no longer
        the one created (deleted, or deleted and made again)."""
        try:
            ino = self.path.stat().st_ino
        except OSError:
            ino = None
        if self._ino is None:
            self._ino = ino
        if ino is None or ino != self._ino:
            raise RunDirGone(self.path, f"the run directory {self.path} was deleted")

    def read_state(self) -> RunState:
        """The last persisted state; ``lost`` when the run is not final and its
        controller is gone. :class:`RunUnreadable` (exit 2) when ``state.json``
        cannot be read or is not a run state."""
        try:
            data = json.loads(self.state_file.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise TypeError(f"expected a JSON object, got {type(data).__name__}")
            state = RunState.from_dict(data)
        except OSError as e:
            raise RunUnreadable(self.run_id, f"state.json: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise RunUnreadable(self.run_id, f"not valid JSON: {str(e)[:120]}") from None
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            what = f"missing {e}" if isinstance(e, KeyError) else str(e)[:120]
            raise RunUnreadable(self.run_id, f"not a run state: {what}") from None
        if not state.phase.terminal and not self.controller_alive():
            state = state.lost()
        return state

    def controller(self) -> RecordedProcess | None:
        """The controller as recorded, if it was."""
        try:
            return RecordedProcess.parse(self.controller_pid.read_text())
        except OSError:
            return None

    def controller_alive(self) -> bool:
        """True while the recorded controller lives (not a process given its pid later)."""
        proc = self.controller()
        return proc is not None and proc.alive()

    def write_json(self, path: Path, data: Any) -> None:
        self.write_text(path, json.dumps(data, indent=1, sort_keys=True))

    def write_plan(
        self,
        plan: Mapping[str, Any],
        secret_keys: Mapping[str, Collection[str]],
        redact: Callable[[str], str] = lambda text: text,
        job_setup: str | None = None,
    ) -> None:
        """``plan.json`` with the env values named by ``secret_keys`` (host → variable
        names) redacted and the Slurm allocation's setup as ``redact`` shows it, and the
        real ones in ``secrets.json`` (:mod:`dmlctl.runs.secrets`), with the job's real
        ``job_setup`` when ``redact`` changes it."""
        data, hidden = run_secrets.split(plan, secret_keys, redact, job_setup)
        self.write_json(self.secrets, hidden)
        self.write_json(self.plan, data)

    def real_setup(self) -> str | None:
        """The job's real ``setup`` when ``specs/job.yaml`` shows it redacted (None:
        the stored one is real, or ``secrets.json`` cannot be read)."""
        try:
            hidden = json.loads(self.secrets.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return run_secrets.real_setup(hidden) if isinstance(hidden, dict) else None

    def read_plan(self) -> LaunchPlan:
        """``plan.json`` with the real env values put back (UsageError when either
        file cannot be read: a plan without its values must not start)."""
        from dmlctl.plan.model import LaunchPlan  # not at import: `status` lists runs without it

        try:
            data = json.loads(self.plan.read_text(encoding="utf-8"))
            hidden = json.loads(self.secrets.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(hidden, dict):
                raise ValueError("not a JSON object")
            return LaunchPlan.from_dict(run_secrets.merge(data, hidden))
        except KeyError as e:
            raise UsageError(
                f"run {self.run_id}: cannot read its plan (no {e} in plan.json: planned by"
                " another version of dmlctl, or damaged)"
            ) from None
        except (OSError, ValueError, TypeError) as e:
            raise UsageError(f"run {self.run_id}: cannot read its plan ({e})") from None


class RunStore:
    """All runs under ``home/runs``."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home if home is not None else dmlctl_home()
        self.root = self.home / "runs"

    def create(self, run_id: str) -> RunDir:
        """Make a new, empty run directory (with specs/ and logs/), all 0700.
        A failure (a full disk) raises StoreError; nothing half-made is left."""
        run = RunDir(self.root / run_id)
        try:
            make_private_dir(self.root)
            run.path.mkdir(mode=DIR_MODE)
        except FileExistsError:
            raise
        except OSError as e:
            raise store_error(e, run.path) from None
        try:
            for sub in (run.logs, run.specs):
                sub.mkdir(mode=DIR_MODE)
        except OSError as e:
            shutil.rmtree(run.path, ignore_errors=True)
            raise store_error(e, run.path) from None
        run.check_present()  # remembers the directory it made
        return run

    def runs(self) -> Iterator[RunDir]:
        """Every run that has a state file, oldest first (by the time in its id); a
        ``state.json`` that is not a file (a directory, a dangling link) still names a
        run, which reads as unreadable."""
        try:
            paths = [p for p in self.root.iterdir() if os.path.lexists(p / "state.json")]
        except OSError:  # no runs yet (or no runs folder that can be read)
            return
        yield from (RunDir(p) for p in sorted(paths, key=_started_key))

    def listing(self) -> list[RunListing]:
        """Every run, oldest first, each read on its own: its state, or why it is
        unreadable (one bad ``state.json`` never hides the other runs)."""
        out = []
        for run in self.runs():
            try:
                out.append(RunListing(run.run_id, run.read_state()))
            except RunUnreadable as e:
                out.append(RunListing(run.run_id, None, e.reason))
        return out

    def get(self, run_id: str) -> RunDir:
        """The run whose id is ``run_id`` or starts with it (must be unambiguous);
        ``last`` names the newest run."""
        runs = list(self.runs())
        if run_id == "last" and runs:
            return max(runs, key=_mtime)
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


def _state_json(state: RunState) -> str:
    """The one text of a run state on disk (``state.json``, ``summary.json``)."""
    return json.dumps(state.to_dict(), indent=1)
