"""Crash-safe, rank-consistent checkpoints under one directory (shared by all ranks).

Layout: ``root/step-<step:09d>/`` holds ``rank-<r>.pt`` per rank and ``manifest.json``
(step, world_size, time, size + sha256 of every file); ``root/LATEST`` names the newest.

Guarantees:

* **Atomic commit.** Files are written and fsynced in ``root/.tmp-step-<step>/``; once
  every rank's file is written, one rank per directory (the first local rank of each
  host that wins the commit lock, so one per host with host-local directories and one
  in all with a shared directory) writes the manifest of *every* rank's file, renames
  the directory into place, then replaces ``LATEST`` (tmp file + fsync +
  ``os.replace``). A crash at any point leaves the previous checkpoint intact and
  ``LATEST`` never absent after the first commit. Leftover ``.tmp-*`` directories are
  ignored by loading and removed by the next save. A host-local directory holds only
  its own ranks' files; the controller merges the hosts' parts into a complete copy
  (``dmlctl.provision.replicate``) and hands it back to the hosts on a restart.
* **Verified load.** :meth:`CheckpointManager.load_latest` checks the manifest, the
  rank's file size + sha256 before unpickling; a bad checkpoint is skipped with a
  :class:`CheckpointWarning` (also on stderr) and the previous one tried — also one
  whose file matches its manifest but cannot be loaded (every rank then moves below
  it). An unreadable ``LATEST`` is ignored: the step directories are scanned. With
  several ranks all resume from the same step: the MIN over the ranks' newest valid
  steps (repeated until every rank holds a valid one at that step). When checkpoints
  exist but none can be loaded, every rank raises :class:`CheckpointCorrupt` — unless
  the job allows a fresh start (``checkpoint.allow_fresh_start``), then it starts
  from step 0 with a warning.
* **A full disk.** A save that runs out of space removes its temporary directory and
  raises :class:`DiskFull` naming the path; the previous checkpoint stays usable.
* **Safe unpickling.** Always ``torch.load(weights_only=True)``; a file that needs
  anything more raises :class:`CheckpointRefused` on every rank. There is no fallback
  to ``weights_only=False``; the payload is never executed.
* **Another world size.** A checkpoint saved by ``n`` ranks resumed by ``m != n``
  ranks (a host was lost, or came back): rank ``r`` loads ``rank-<r mod n>.pt``, with
  a warning. Exact for data-parallel state (every replica holds the same model and
  optimizer); strategies with per-rank state start from a replica's state.
* **Collective.** ``save``, ``load_latest`` and ``due`` (with ``every_seconds``) must be
  called by every rank in the same order.

This module runs the collective protocol (:class:`CheckpointManager`; its load side is
:mod:`dmlctl.runtime.checkpoint_load`); what is done to
the directory on disk, one rank at a time, is :mod:`dmlctl.runtime.checkpoint_dir`'s,
and what a rank's state holds is :mod:`dmlctl.runtime.resume`'s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dmlctl.checkpoint_files import fsync_path, sha256_file
from dmlctl.protocol import (
    ENV_CHECKPOINT_ALLOW_FRESH,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_SECONDS,
    ENV_CHECKPOINT_EVERY_STEPS,
    ENV_CHECKPOINT_KEEP,
    ENV_CHECKPOINT_WARM_START,
    ENV_RUN_ID,
    checkpoint_step_dir,
    rank_file,
)
from dmlctl.runtime.checkpoint_dir import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointRefused,
    CheckpointWarning,
    DiskFull,
    commit,
    disk_full,
    make_root_once,
    take_lock,
    write_synced,
)
from dmlctl.runtime.checkpoint_load import CheckpointLoading
from dmlctl.runtime.resume import (
    capture_rng,
    rank_state,
    restore_rng,
    restore_training_state,
    training_state,
)

__all__ = [
    "ENV_CHECKPOINT_ALLOW_FRESH",
    "ENV_CHECKPOINT_DIR",
    "ENV_CHECKPOINT_EVERY_SECONDS",
    "ENV_CHECKPOINT_EVERY_STEPS",
    "ENV_CHECKPOINT_KEEP",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointRefused",
    "CheckpointWarning",
    "DiskFull",
    "capture_rng",
    "rank_state",
    "restore_rng",
    "restore_training_state",
    "training_state",
]


class _AgreedFailure(Exception):
    """A save every rank gave up together (its temporary directory already removed)."""

    def __init__(self, error: CheckpointError) -> None:
        super().__init__(str(error))
        self.error = error


class CheckpointManager(CheckpointLoading):
    """Saves and restores this rank's state dict; see the module docstring.

    ``every_steps`` / ``every_seconds`` set :meth:`due` (either one suffices);
    ``keep`` is how many committed checkpoints survive a save.
    """

    def __init__(
        self,
        root: str,
        rank: int,
        world_size: int,
        *,
        keep: int = 3,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        local_rank: int | None = None,
        group: Any = None,
        src: int = 0,
        allow_fresh_start: bool = False,
        run_id: str | None = None,
        warm_start: bool = False,
        writes: bool = True,
        peers: int | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.rank, self.world_size, self.keep = rank, world_size, keep
        #: Whether this rank may commit in its directory: the first rank of its host
        #: (``local_rank`` 0), or rank 0 when the local rank is not known.
        self.leader = local_rank == 0 if local_rank is not None else rank == 0
        #: Whether the last :meth:`save` was committed by this rank (then the
        #: controller is told, so it can copy this directory's part).
        self.committed_here = False
        self.every_steps, self.every_seconds = every_steps, every_seconds
        #: Whether this rank saves at all (``restart.mode: in_place``: one worker saves
        #: alone, and every worker resumes from its file).
        self.writes = writes
        #: The ranks that load together, agreeing on the step over ``group`` (one
        #: file shared by ``peers`` ranks when ``world_size`` is 1: in place).
        self.peers = world_size if peers is None else peers
        #: The ranks' process group (None: the default group) and the global rank of
        #: its first member (with parameter servers: the workers' group).
        self.group, self.src = group, src
        self._last_save = time.monotonic()
        self._last_step: int | None = None
        #: Whether to start from step 0 when every checkpoint is corrupt.
        self.allow_fresh_start = allow_fresh_start
        #: The run this manager saves for (recorded in every manifest), and whether it
        #: may resume from a checkpoint another run wrote (``checkpoint.warm_start``).
        self.run_id, self.warm_start = run_id, warm_start
        #: Whether the directory has been seen: from then on it is never made again
        #: (deleted while the run runs — with the run directory — it stays deleted).
        self._seen = self.root.is_dir()
        self._problems: list[str] = []  # why checkpoints were skipped, in this load
        self._write_error: BaseException | None = None  # why the last save's write failed

    @classmethod
    def from_env(
        cls,
        rank: int,
        world_size: int,
        local_rank: int | None = None,
        *,
        group: Any = None,
        src: int = 0,
        writes: bool = True,
        peers: int | None = None,
    ) -> CheckpointManager | None:
        """The manager the ``DMLCTL_CHECKPOINT_*`` variables describe (None without a dir)."""
        root = os.environ.get(ENV_CHECKPOINT_DIR)
        if not root:
            return None
        steps, secs = (
            os.environ.get(k) for k in (ENV_CHECKPOINT_EVERY_STEPS, ENV_CHECKPOINT_EVERY_SECONDS)
        )
        return cls(
            root,
            rank,
            world_size,
            keep=int(os.environ.get(ENV_CHECKPOINT_KEEP, "3")),
            every_steps=int(steps) if steps else None,
            every_seconds=float(secs) if secs else None,
            local_rank=local_rank,
            group=group,
            src=src,
            allow_fresh_start=os.environ.get(ENV_CHECKPOINT_ALLOW_FRESH) == "1",
            run_id=os.environ.get(ENV_RUN_ID) or None,
            warm_start=os.environ.get(ENV_CHECKPOINT_WARM_START) == "1",
            writes=writes,
            peers=peers,
        )

    def due(self, step: int) -> bool:
        """Whether to save after ``step``; the same answer on every rank (for
        ``every_seconds`` rank 0's clock decides and broadcasts: a collective);
        never on a rank that does not write."""
        if step == self._last_step or not self.writes:
            return False
        flag = bool(self.every_steps) and step % (self.every_steps or 1) == 0
        if self.every_seconds is not None:
            late = time.monotonic() - self._last_save >= self.every_seconds
            decided = torch.tensor([int(flag or late)])
            if self._collective():
                dist.broadcast(decided, src=self.src, group=self.group)
            flag = bool(decided.item())
        return flag

    def save(self, step: int, state: dict[str, Any]) -> str:
        """Write ``state`` as this rank's part of checkpoint ``step``; returns the
        committed directory. Collective when ``world_size > 1``. A rank that cannot
        write its part (a full disk raises :class:`DiskFull`) fails the save on every
        rank, after every rank has stopped writing, and the temporary directory is
        removed once; the previous checkpoint stays intact."""
        tmp = self.root / f".tmp-step-{step}"
        try:
            return self._save(step, state, tmp)
        except _AgreedFailure as agreed:
            raise agreed.error from agreed.error.__cause__
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # never left behind, whatever stopped us
            raise

    def _write_part(self, state: dict[str, Any], tmp: Path) -> dict[str, Any]:
        """Write this rank's file in ``tmp``: its manifest entry, or ``{"error": …}``
        saying why it could not (the exception is kept in ``self._write_error``)."""
        self._write_error = None
        try:
            self._make_tmp(tmp)
            for stale in tmp.glob(".commit-*"):  # a crashed save's lock; this save's later
                stale.unlink(missing_ok=True)
            path = tmp / rank_file(self.rank)
            write_synced(path, state)
            fsync_path(tmp)
        except Exception as exc:
            self._write_error = exc
            full = disk_full(exc)
            where = full.filename if full is not None and full.filename else tmp
            return {
                "rank": self.rank,
                "error": f"{type(exc).__name__}: {exc}",
                "full": full is not None,
                "where": str(where),
            }
        # Rank 0's token names this save's commit lock (a stale lock of a crashed
        # attempt never blocks a commit).
        token = os.urandom(8).hex()
        return {"sha256": sha256_file(path), "size": path.stat().st_size, "token": token}

    def _make_tmp(self, tmp: Path) -> None:
        """Make ``tmp`` in the checkpoint directory, and the directory itself (with its
        parents) the first time only: one that was there and is gone raises
        ``FileNotFoundError`` instead of coming back."""
        make_root_once(self.root, self._seen)
        self._seen = True
        with contextlib.suppress(FileExistsError):
            os.mkdir(tmp, 0o700)  # never its parents

    def _failure(self, step: int, mine: dict[str, Any], entries: list[Any]) -> CheckpointError:
        """The error every rank raises when some rank could not write its part: its
        own failure, or else the first failed rank's."""
        bad = mine if "error" in mine else next(e for e in entries if "error" in e)
        who = "" if bad is mine else f"rank {bad['rank']}: "
        if bad["full"]:
            return DiskFull(
                f"{who}no space left on the device writing checkpoint step {step} "
                f"({bad['where']}); the previous checkpoint in {self.root} is intact"
            )
        return CheckpointError(
            f"{who}could not write checkpoint step {step} in {self.root}: {bad['error']}; "
            "the previous checkpoint is intact"
        )

    def _save(self, step: int, state: dict[str, Any], tmp: Path) -> str:
        entry = self._write_part(state, tmp)
        entries: list[Any] = [entry] * self.world_size
        if self._collective():  # doubles as the barrier before the commit
            dist.all_gather_object(entries, entry, group=self.group)
        if any("error" in e for e in entries):  # every rank has stopped writing
            if self.leader:
                shutil.rmtree(tmp, ignore_errors=True)
            error = self._failure(step, entry, entries)
            error.__cause__ = self._write_error
            raise _AgreedFailure(error)
        more = self._more_files(tmp)
        final = self.root / checkpoint_step_dir(step)
        lock = f".commit-{entries[0]['token']}"
        self.committed_here = self.leader and take_lock(tmp / lock)
        if self.committed_here:
            files = {
                rank_file(r): {"sha256": e["sha256"], "size": e["size"]}
                for r, e in enumerate(entries)
            }
            sharded = bool(more)
            commit(
                self.root,
                step,
                tmp,
                final,
                self.world_size,
                self.keep,
                {**files, **more},
                sharded,
                run_id=self.run_id,
            )
            (final / lock).unlink(missing_ok=True)
        if self._collective():
            dist.barrier(group=self.group)
        self._last_save, self._last_step = time.monotonic(), step
        return str(final)

    def _more_files(self, tmp: Path) -> dict[str, Any]:
        """Files besides the ranks' own that the checkpoint in ``tmp`` holds (name →
        size and sha256), once every rank wrote its file: none here; a sharded
        checkpoint writes its shards now (collective)."""
        del tmp
        return {}
