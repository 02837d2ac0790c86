"""The load side of :class:`~dmlctl.runtime.checkpoint.CheckpointManager`: every rank
agrees on the newest checkpoint they all hold, verified, safely unpickled, written by
this run (see that module's docstring for the guarantees). Collective."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dmlctl.checkpoint_files import step_dirs
from dmlctl.protocol import CHECKPOINT_LATEST
from dmlctl.runtime.checkpoint_dir import (
    CheckpointCorrupt,
    CheckpointForeign,
    CheckpointRefused,
    CheckpointWarning,
    Unloadable,
    candidates,
    load_rank_file,
    saved_by,
    verify,
)

NONE_STEP = -1
"""The step of no checkpoint (in the ranks' MIN over their newest valid steps)."""


class CheckpointLoading:
    """Loading, for :class:`~dmlctl.runtime.checkpoint.CheckpointManager` (which sets
    these attributes)."""

    root: Path
    rank: int
    world_size: int
    peers: int  # the ranks that load together (world_size unless they share one file)
    group: Any
    allow_fresh_start: bool
    run_id: str | None
    warm_start: bool
    _problems: list[str]

    def _collective(self) -> bool:
        return self.world_size > 1 and dist.is_initialized()

    def _agreeing(self) -> bool:
        """Whether loading agrees with other ranks (a collective over ``group``)."""
        return self.peers > 1 and dist.is_initialized()

    def _newest_valid(self, bound: int | None) -> tuple[int, Path | None]:
        """This rank's newest verified checkpoint at or below ``bound``."""
        cands = [(s, p) for s, p in candidates(self.root) if bound is None or s <= bound]
        for i, (step, path) in enumerate(cands):
            reason = verify(path, step, self.rank)
            if reason is None:
                return step, path
            self._skipped(path, f"is corrupt ({reason})", cands[i + 1 :])
        return NONE_STEP, None

    def _skipped(self, path: Path, why: str, rest: list[tuple[int, Path]]) -> None:
        after = rest[0][1].name if rest else "nothing"
        msg = f"checkpoint {path.name} {why}; falling back to {after}"
        self._problems.append(f"{path.name} {why}")
        warnings.warn(msg, CheckpointWarning, stacklevel=4)
        print(f"dmlctl rank {self.rank}: {msg}", file=sys.stderr, flush=True)

    def _any(self, flag: bool) -> bool:
        """``flag`` of any rank (a collective when there are several)."""
        box = torch.tensor([int(flag)], dtype=torch.int64)
        if self._agreeing():
            dist.all_reduce(box, op=dist.ReduceOp.MAX, group=self.group)
        return bool(box.item())

    def load_latest(self) -> tuple[int, dict[str, Any]] | None:
        """``(step, state)`` of the newest valid checkpoint all ranks hold, or None
        when there is none at all.

        Collective when ``world_size > 1``; raises :class:`CheckpointRefused` on every
        rank when any rank's chosen file needs unsafe unpickling, and
        :class:`CheckpointCorrupt` on every rank when checkpoints exist but none can
        be loaded (unless ``allow_fresh_start``: then None, with a warning)."""
        self._problems = []
        bound: int | None = None
        while True:
            step, path = self._newest_valid(bound)
            agreed = step
            if self._agreeing():
                box = torch.tensor([step, -step], dtype=torch.int64)
                dist.all_reduce(box, op=dist.ReduceOp.MIN, group=self.group)
                agreed, highest = int(box[0]), -int(box[1])
                if agreed != highest and agreed >= 0:
                    bound = agreed  # someone is behind: everyone retries at its step
                    continue
            if agreed < 0:
                self._nothing_usable()
                return None
            assert path is not None
            state: dict[str, Any] = {}
            refused: CheckpointRefused | None = None
            try:
                state = load_rank_file(path, self.rank, self.world_size)
            except CheckpointRefused as exc:
                refused = exc
            except Unloadable as exc:
                self._skipped(
                    path,
                    f"cannot be loaded ({exc})",
                    [(s, p) for s, p in candidates(self.root) if s < agreed],
                )
            # a refusal anywhere stops every rank, none hangs: 1 + the refusing rank;
            # a file that cannot be loaded anywhere moves every rank below this step
            flag = torch.tensor(
                [self.rank + 1 if refused else 0, int(not state and refused is None)],
                dtype=torch.int64,
            )
            if self._agreeing():
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            if refused is not None:
                raise refused
            if int(flag[0]) > 0:
                who = int(flag[0]) - 1
                raise CheckpointRefused(
                    f"another rank refused {path.name}: rank {who}'s file needs unsafe unpickling"
                )
            if int(flag[1]) > 0:
                bound = agreed - 1
                continue
            self._check_owner(path, agreed)
            return agreed, state

    def _check_owner(self, path: Path, step: int) -> None:
        """Raise :class:`CheckpointForeign` on every rank when any rank's checkpoint
        ``path`` was written by another run (unless ``warm_start``: then say so and go
        on). Collective."""
        owner = saved_by(path)
        foreign = owner is not None and self.run_id is not None and owner != self.run_id
        if not self._any(foreign):
            return
        whose = f"run {owner}" if foreign else "another run (on another rank's host)"
        if self.warm_start:
            print(
                f"dmlctl rank {self.rank}: warm start from {whose}'s checkpoint {path.name} "
                "(checkpoint.warm_start)",
                file=sys.stderr,
                flush=True,
            )
            return
        raise CheckpointForeign(
            f"checkpoint {path.name} in {self.root} (step {step}) was written by {whose}, "
            "not this one: a new run does not continue another's training. Continue that "
            "run with `dmlctl launch --resume RUN`, start from its checkpoint with "
            "checkpoint.warm_start: true, or give this run its own checkpoint.dir "
            "(e.g. with {run_id} in it)"
        )

    def _nothing_usable(self) -> None:
        """No checkpoint every rank can load: fine when there were none at all (or a
        fresh start is allowed), else :class:`CheckpointCorrupt` on every rank."""
        existed = self._any(bool(step_dirs(self.root)) or (self.root / CHECKPOINT_LATEST).exists())
        if not existed:
            return
        why = "; ".join(self._problems[:3]) or "another rank's checkpoints are unusable"
        if self.allow_fresh_start:
            msg = f"no usable checkpoint in {self.root} ({why}); starting from step 0"
            warnings.warn(msg, CheckpointWarning, stacklevel=3)
            print(f"dmlctl rank {self.rank}: {msg}", file=sys.stderr, flush=True)
            return
        raise CheckpointCorrupt(
            f"no usable checkpoint in {self.root} ({why}); set checkpoint.allow_fresh_start: "
            "true to start from step 0 instead"
        )
