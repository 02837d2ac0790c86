"""A worker's own part of an in-place run's checkpoint (``restart.mode: in_place``).

In such a run the first worker writes the checkpoint alone (no collective that a
replacement could not join), so by itself it holds only that worker's optimizer and
strategy state. :class:`OwnPart` lets every other worker keep its own state beside it,
also without a collective: ``<checkpoint dir>/workers/rank-<r>/step-<step:09d>.pt``,
written to a temporary file, fsynced and renamed into place, the ``keep`` newest kept.
After a full restart each worker takes its own part back (its model, optimizer with
the strategy's per-worker state — ADMM's duals, local momentum, Adam's moments — RNGs
and data position), as every rank does from its own file in a run that restarts in
full. A synchronous worker takes its part of the step the workers agreed on; without
one (with ``every_seconds`` each worker saves by its own clock) its newest part before
that step gives its optimizer, strategy state and RNGs, the model staying the first
worker's; with none at all it resumes from the first worker's state, and says so.

A part is only used by the run that wrote it (or one warm-started from its
checkpoints), and only when it loads with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dmlctl.checkpoint_files import fsync_path
from dmlctl.private_files import make_private_dirs
from dmlctl.runtime.checkpoint_dir import (
    CheckpointWarning,
    DiskFull,
    disk_full,
    make_root_once,
    write_synced,
)

OWN_DIR = "workers"
"""The subdirectory of the checkpoint directory that holds the workers' own parts."""
if TYPE_CHECKING:
    from dmlctl.runtime.checkpoint import CheckpointManager

_PART = re.compile(r"^step-(\d+)\.pt$")


def part_dir(root: Path, rank: int) -> Path:
    """Where worker ``rank`` keeps its own parts under checkpoint directory ``root``."""
    return root / OWN_DIR / f"rank-{rank}"


class OwnPart:
    """One worker's own checkpoint parts: saved on its own schedule (the same
    ``every_steps`` as the writer's, so workers that meet every round save at the
    same steps), loaded back by step or newest."""

    def __init__(
        self,
        root: Path,
        rank: int,
        *,
        keep: int,
        every_steps: int | None,
        every_seconds: float | None,
        run_id: str | None,
        warm_start: bool,
    ) -> None:
        self.root, self.rank, self.keep = root, rank, max(1, keep)
        self.dir = part_dir(root, rank)
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self.run_id, self.warm_start = run_id, warm_start
        self._seen = root.is_dir()
        self._last_save = time.monotonic()
        self._last_step: int | None = None

    @classmethod
    def beside(cls, manager: CheckpointManager, rank: int) -> OwnPart:
        """Worker ``rank``'s part beside ``manager``'s shared checkpoint: its
        directory, ``keep``, schedule, run and warm start."""
        return cls(
            manager.root,
            rank,
            keep=manager.keep,
            every_steps=manager.every_steps,
            every_seconds=manager.every_seconds,
            run_id=manager.run_id,
            warm_start=manager.warm_start,
        )

    def due(self, step: int) -> bool:
        """Whether to save after ``step`` (never twice for one step): a multiple of
        ``every_steps``, or ``every_seconds`` since the last save by this worker's clock."""
        if step == self._last_step:
            return False
        if self.every_steps and step % self.every_steps == 0:
            return True
        late = time.monotonic() - self._last_save
        return self.every_seconds is not None and late >= self.every_seconds

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write ``state`` as this worker's part of ``step`` atomically and prune the
        oldest beyond ``keep``; returns the file. A full disk raises
        :class:`DiskFull` (the earlier parts stay), a checkpoint directory deleted
        while the run runs ``FileNotFoundError`` (it is not made again)."""
        self._make_dir()
        final = self.dir / f"step-{step:09d}.pt"
        tmp = self.dir / f".tmp-{final.name}"
        try:
            write_synced(tmp, {**state, "run_id": self.run_id})
            os.replace(tmp, final)
            fsync_path(self.dir)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if disk_full(exc) is not None:
                raise DiskFull(
                    f"no space left on the device writing worker {self.rank}'s part of "
                    f"checkpoint step {step} ({final}); its previous parts are intact"
                ) from exc
            raise
        for _, old in self.parts()[self.keep :]:
            old.unlink(missing_ok=True)
        self._last_save, self._last_step = time.monotonic(), step
        return final

    def _make_dir(self) -> None:
        make_root_once(self.root, self._seen)
        self._seen = True
        make_private_dirs(str(self.dir))

    def parts(self) -> list[tuple[int, Path]]:
        """(step, file) of every part this worker kept, newest first."""
        found: list[tuple[int, Path]] = []
        with contextlib.suppress(OSError):
            for path in self.dir.iterdir():
                if (m := _PART.match(path.name)) is not None:
                    found.append((int(m.group(1)), path))
        return sorted(found, reverse=True)

    def load(self, step: int | None, *, at_most: bool = False) -> tuple[int, dict[str, Any]] | None:
        """(step, state) of this worker's part of ``step`` (None: its newest; with
        ``at_most``: its newest part of ``step`` or before), or None when there is none
        it may use: missing, another run's, or not loadable with ``weights_only=True``
        (then with a :class:`CheckpointWarning`)."""
        for saved, path in self.parts():
            if step is None or saved == step or (at_most and saved < step):
                state = self._read(path)
                return None if state is None else (saved, state)
        return None

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            warnings.warn(f"{path} cannot be loaded ({why})", CheckpointWarning, stacklevel=3)
            return None
        if not isinstance(state, dict):
            return None
        if state.pop("run_id", None) != self.run_id and not self.warm_start:
            return None
        return state
