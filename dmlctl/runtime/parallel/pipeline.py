"""Pipeline parallelism with ``torch.distributed.pipelining``.

:func:`split_sequential` cuts an ``nn.Sequential`` into contiguous stages whose
largest parameter count is as small as it can be, each stage an ``nn.Sequential`` of
the original children under their original names, so a stage's ``state_dict`` keys
are the whole model's (checkpoints move between layouts). :class:`PipelinedModel` is
what ``ctx.prepare`` returns on a pipeline rank: this rank's stages, run by the job's
schedule in :meth:`PipelinedModel.train_step` (forward and backward of every
microbatch).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    get_schedule_class,
)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def split_sequential(model: nn.Module, n_stages: int) -> list[nn.Sequential]:
    """``model``'s children cut into ``n_stages`` contiguous stages balanced by
    parameter count (each at least one child; the largest stage as small as it can
    be). Raises ValueError when ``model`` is
    not an ``nn.Sequential`` or has fewer children than stages."""
    if not isinstance(model, nn.Sequential):
        raise ValueError(
            f"pipeline parallelism splits an nn.Sequential by its children; this model is "
            f"a {type(model).__name__}: make it a Sequential of blocks, or give the job a "
            "'parallelize: FILE:FUNCTION' that returns this rank's stages "
            "(docs/parallelism.md)"
        )
    children = list(model.named_children())
    if len(children) < n_stages:
        raise ValueError(
            f"the model has {len(children)} children, fewer than the {n_stages} pipeline stages"
        )
    sizes = [sum(p.numel() for p in c.parameters()) for _, c in children]
    cuts = _balanced_cuts(sizes, n_stages)
    bounds = [0, *cuts, len(children)]
    return [
        nn.Sequential(OrderedDict(children[bounds[i] : bounds[i + 1]])) for i in range(n_stages)
    ]


def _balanced_cuts(sizes: Sequence[int], n: int) -> list[int]:
    """``n - 1`` cut positions in ``sizes`` (every part non-empty) that make the
    largest part's sum as small as it can be (the linear-partition problem, solved
    exactly by dynamic programming: a few dozen children at most)."""
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    count = len(sizes)
    inf = float("inf")
    # best[k][i]: the smallest largest-part sum of the first i children in k parts
    best = [[inf] * (count + 1) for _ in range(n + 1)]
    cut = [[0] * (count + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for k in range(1, n + 1):
        for i in range(k, count + 1):
            for j in range(k - 1, i):  # the k-th part is children j .. i-1
                load = max(best[k - 1][j], prefix[i] - prefix[j])
                if load < best[k][i]:
                    best[k][i], cut[k][i] = load, j
    cuts, i = [], count
    for k in range(n, 1, -1):
        i = cut[k][i]
        cuts.append(i)
    return sorted(cuts)


class PipelinedModel(nn.Module):
    """This rank's pipeline stages (``stage_ids`` of ``n_stages``) and the schedule
    that runs them over ``group`` (the pipeline dimension of the mesh)."""

    def __init__(
        self,
        stages: Sequence[nn.Module],
        stage_ids: Sequence[int],
        n_stages: int,
        *,
        group: dist.ProcessGroup,
        schedule: str,
        microbatches: int,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.stage_ids, self.n_stages = list(stage_ids), n_stages
        self.group, self.schedule_name, self.microbatches = group, schedule, microbatches
        self.device = device
        self._schedule: Any = None
        self._loss_fn: LossFn | None = None

    @property
    def first(self) -> bool:
        """Whether this rank holds the first stage (it feeds the inputs)."""
        return 0 in self.stage_ids

    @property
    def last(self) -> bool:
        """Whether this rank holds the last stage (it computes the loss)."""
        return self.n_stages - 1 in self.stage_ids

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "under pipeline parallelism a rank holds only some stages of the model: train "
            "with `loss = ctx.train_step(model, inputs, targets, loss_fn)` and evaluate "
            "with `ctx.eval_step(...)` (every microbatch through the job's schedule)"
        )

    def train_step(
        self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn
    ) -> torch.Tensor:
        """Forward and backward of ``inputs`` in ``microbatches`` microbatches; the
        gradients of this rank's stages accumulate (scaled as for the whole batch).
        Returns the batch's mean loss on every rank of the pipeline (one broadcast
        from the rank holding the last stage)."""
        return self._run(inputs, targets, loss_fn, backward=True)

    def eval_step(
        self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn
    ) -> torch.Tensor:
        """:meth:`train_step` without the backward pass (no gradients change)."""
        return self._run(inputs, targets, loss_fn, backward=False)

    def _run(
        self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn, *, backward: bool
    ) -> torch.Tensor:
        if inputs.shape[0] % self.microbatches:
            raise ValueError(
                f"a batch of {inputs.shape[0]} samples does not split into "
                f"{self.microbatches} microbatches (pipeline_parallel_microbatches): make "
                "the batch size a multiple of it"
            )
        schedule = self._schedule_for(loss_fn)
        run = schedule.step if backward else schedule.eval
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.first else ()
        if self.last:
            run(*args, target=targets, losses=losses)
        else:
            run(*args)
        mean = torch.zeros((), dtype=torch.float32)
        if self.last:
            mean = torch.stack([loss.detach().float() for loss in losses]).mean()
        src = dist.get_global_rank(self.group, self._last_rank())
        dist.broadcast(mean, src=src, group=self.group)
        return mean

    def _last_rank(self) -> int:
        """The pipeline rank that holds the last stage."""
        pp = dist.get_world_size(self.group)
        per_rank = len(self.stage_ids)
        if per_rank == 1:
            return pp - 1
        v_shaped = self.stage_ids[1] == 2 * pp - 1 - self.stage_ids[0]
        return 0 if v_shaped else pp - 1

    def _schedule_for(self, loss_fn: LossFn) -> Any:
        """The schedule, built on first use (it needs the loss function)."""
        if self._schedule is not None and loss_fn is self._loss_fn:
            return self._schedule
        stages = [
            PipelineStage(module, sid, self.n_stages, self.device, group=self.group)
            for module, sid in zip(self.stages, self.stage_ids, strict=True)
        ]
        cls = get_schedule_class(self.schedule_name)
        if issubclass(cls, PipelineScheduleSingle):
            self._schedule = cls(stages[0], n_microbatches=self.microbatches, loss_fn=loss_fn)
        elif issubclass(cls, PipelineScheduleMulti):
            self._schedule = cls(stages, n_microbatches=self.microbatches, loss_fn=loss_fn)
        else:  # pragma: no cover - every named schedule is one of the two
            raise ValueError(f"unknown kind of pipeline schedule {self.schedule_name!r}")
        self._loss_fn = loss_fn
        return self._schedule
