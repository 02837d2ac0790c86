"""Checkpoints of a model laid out on a device mesh (``parallelism:``), with
``torch.distributed.checkpoint`` (DCP).

A checkpoint directory holds, besides each rank's small file (RNG states, data
position, strategy state, extras — as :mod:`dmlctl.runtime.checkpoint` writes them),
DCP's shards of the model and optimizer state (``__<r>_<i>.distcp`` and
``.metadata``), every one listed with its size and sha256 in the manifest and all of
them verified before a load. The commit protocol, ``LATEST``, pruning, fallback to an
older checkpoint and the ranks' agreement on one step are the same as for plain
checkpoints.

State dicts are keyed by the whole model's parameter names (a pipeline stage keeps
them; tensor parallelism and FSDP2 keep them) and hold DTensors where the layout
shards, so a checkpoint saved under one layout loads under another — tensor degree
2 resumed with FSDP over 2 ranks, a pipeline resumed as tensor parallel, … — DCP
reshards on load.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from dmlctl.checkpoint_files import sha256_file
from dmlctl.protocol import checkpoint_step_dir
from dmlctl.runtime.checkpoint import CheckpointManager
from dmlctl.runtime.checkpoint_dir import DiskFull, disk_full
from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.runtime.parallel.pipeline import PipelinedModel
from dmlctl.runtime.resume import restore_rank_state


def whole_named(model: nn.Module) -> nn.Module:
    """A module whose parameter names are the whole model's: ``model`` itself, or for
    a pipeline rank a module holding its stages' children under their own names."""
    if not isinstance(model, PipelinedModel):
        return model
    flat = nn.Module()
    for stage in model.stages:
        for name, child in stage.named_children():
            flat.add_module(name, child)
    return flat


def torch_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside a strategy's wrapper (or ``optimizer`` itself)."""
    return optimizer.inner if isinstance(optimizer, StrategyOptimizer) else optimizer


class ShardedCheckpointManager(CheckpointManager):
    """A :class:`CheckpointManager` whose checkpoints also hold the DCP shards of
    :attr:`model` and :attr:`optimizer` (set them before saving or loading)."""

    model: nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None

    def bind(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """The model and optimizer whose state the checkpoints shard."""
        self.model, self.optimizer = model, optimizer

    def _state_dicts(self) -> dict[str, Any]:
        assert self.model is not None and self.optimizer is not None, "bind() first"
        msd, osd = get_state_dict(whole_named(self.model), torch_optimizer(self.optimizer))
        return {"model": msd, "optim": osd}

    def _more_files(self, tmp: Path) -> dict[str, Any]:
        """Write the shards into ``tmp`` (collective over the workers) and return every
        shard file's size and sha256 (gathered from the ranks that wrote them)."""
        before = set(p.name for p in tmp.iterdir())
        try:
            dcp_save(self._state_dicts(), checkpoint_id=str(tmp), process_group=self.group)
        except Exception as exc:
            full = disk_full(exc) or _disk_full_inside(exc)
            if full is not None:
                raise DiskFull(
                    f"no space left on the device writing the shards of a checkpoint in "
                    f"{tmp} ({full}); the previous checkpoint in {self.root} is intact"
                ) from exc
            raise
        mine = {
            p.name: {"sha256": sha256_file(p), "size": p.stat().st_size}
            for p in tmp.iterdir()
            if p.name not in before and _written_by(p.name, self._group_rank())
        }
        parts: list[Any] = [mine] * self.world_size
        if self._collective():
            torch.distributed.all_gather_object(parts, mine, group=self.group)
        return {name: entry for part in parts for name, entry in part.items()}

    def _group_rank(self) -> int:
        return torch.distributed.get_rank(self.group) if self._collective() else 0

    def load_shards(self, step: int) -> None:
        """Load checkpoint ``step``'s shards into the bound model and optimizer,
        resharded to this layout (collective over the workers)."""
        path = self.root / checkpoint_step_dir(step)
        state = self._state_dicts()
        dcp_load(state, checkpoint_id=str(path), process_group=self.group)
        set_state_dict(
            whole_named(self.model) if self.model is not None else nn.Module(),
            torch_optimizer(self.optimizer) if self.optimizer is not None else [],
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )


def _written_by(name: str, group_rank: int) -> bool:
    """Whether DCP's file ``name`` is one rank ``group_rank`` wrote (its shards; the
    first rank also writes the metadata)."""
    if name == ".metadata":
        return group_rank == 0
    return name.startswith(f"__{group_rank}_") and name.endswith(".distcp")


def _disk_full_inside(exc: BaseException) -> OSError | None:
    """The "no space left" error among a DCP ``CheckpointException``'s per-rank
    failures, if any."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        for failure in failures.values():
            if isinstance(failure, BaseException):
                found = disk_full(failure)
                if found is not None:
                    return found
    return None


def small_state(
    optimizer: torch.optim.Optimizer, common: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """What a rank's own file holds next to the shards: the strategy's state (a
    wrapper's counters and buffers), then ``common()``
    (:func:`~dmlctl.runtime.resume.rank_state`: the model's ``strategy_state()``, RNG
    states, the data position and ``extra``), taken after it, as a whole-file
    checkpoint takes them."""
    strategy: dict[str, Any] = {}
    if isinstance(optimizer, StrategyOptimizer):
        strategy = {"local_steps": optimizer.local_steps, **optimizer.strategy_state()}
    return {"optimizer_strategy": strategy, **common()}


def restore_small_state(
    state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Undo :func:`small_state` (after the shards were loaded)."""
    if isinstance(optimizer, StrategyOptimizer):
        strategy = dict(state.get("optimizer_strategy", {}))
        optimizer.local_steps = int(strategy.pop("local_steps", optimizer.local_steps))
        optimizer.load_strategy_state(strategy)
    restore_rank_state(state, model)
