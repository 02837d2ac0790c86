"""Model averaging: local SGD, post-local SGD and hierarchical local SGD.

Update rule. Every worker ``i`` runs the user's optimizer on its own batches (local
steps); after every ``H = period`` local steps all workers replace their parameters
by the average ``x_i ← x̄ = (1/N) Σ_j x_j``. During the first ``warmup_steps`` steps
the average is taken after *every* step (post-local SGD, Lin et al. 2020): with plain
SGD a local step followed by averaging is exactly a synchronous-SGD step, since
``mean_i(x − η g_i) = x − η mean_i(g_i)``. With ``hierarchical: true`` the workers of
one host average among themselves every ``H`` steps and all workers average every
``H · hierarchy_factor`` steps (the global round replaces the host round that falls on
the same step); on a single host that is simply global averaging every ``H`` steps.

Promises:

* ``prepare`` returns the model unchanged (not wrapped) after broadcasting rank 0's
  parameters and floating-point buffers once, so every rank starts identical; at world
  size 1 the optimizer also comes back unchanged.
* One round = one all-reduce of one flat buffer (parameters + the buffers that change
  in training, such as BatchNorm statistics: :mod:`dmlctl.runtime.buffers`; constant
  and integer buffers are never averaged), counted in ``comm_bytes_per_step``: after warm-up
  that is ``buffer bytes / H`` per step. After a global round all ranks hold
  identical parameters (everyone copies the same reduced buffer).
* ``consensus`` = ``sqrt(mean_i ||x_i − x̄||²)`` over the parameters, measured just
  *before* the latest global round (``consensus_host``: the same within a host). It
  costs one scalar all-reduce, not counted as training traffic.
* The inner optimizer's state (momentum, Adam moments) stays local, never averaged.
* ``threshold`` > 0 (the model filter, :class:`~dmlctl.strategies.common.ChangeFilter`):
  a global round averages only the tensors whose change since they were last
  averaged exceeds ``threshold`` × their norm on some worker (one all-reduce of a flag
  per tensor first); the others keep their change for a later round. ``sent_share``
  reports the share of the elements sent; the final model averages everything.

The parameters are :mod:`dmlctl.strategies.local_sgd.params`'s; this module imports
torch (hosts only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from pydantic import BaseModel

from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.strategies import elastic_start
from dmlctl.strategies.common import (
    ChangeFilter,
    assign_flat,
    average_in_place,
    average_round,
    mean_and_consensus,
    with_exchanged_buffers,
)
from dmlctl.strategies.elastic import ElasticAverager
from dmlctl.strategies.local_sgd.params import Params
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


def host_subgroup(ctx: Context) -> tuple[dist.ProcessGroup | None, int]:
    """This rank's host group and its size; ``(None, size)`` when the host has a single
    worker or the run a single host (no subgroup needed). Collective.

    torchrun numbers the ranks of one host contiguously, so ``rank - local_rank`` (the
    host's first rank) identifies the host; hosts may run different worker counts."""
    key = torch.tensor([ctx.rank - ctx.local_rank], dtype=torch.int64)
    keys = [torch.zeros_like(key) for _ in range(ctx.world_size)]
    dist.all_gather(keys, key)
    hosts: dict[int, list[int]] = {}
    for rank, k in enumerate(keys):
        hosts.setdefault(int(k.item()), []).append(rank)
    size = len(hosts[int(key.item())])
    if len(hosts) == 1 or all(len(r) == 1 for r in hosts.values()):
        return None, size
    group, _ = dist.new_subgroups_by_enumeration(list(hosts.values()))  # type: ignore[no-untyped-call]
    return group, size


class LocalSGDOptimizer(StrategyOptimizer):
    """The user's optimizer plus periodic (optionally hierarchical) averaging.

    ``params`` and the buffers exchanged (:mod:`dmlctl.runtime.buffers`) are the
    tensors averaged; a global round happens every
    ``period * global_every`` steps after warm-up, host rounds (over ``host_group``,
    ``host_size`` ranks) in between."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        *,
        world_size: int,
        period: int,
        warmup: int = 0,
        host_group: dist.ProcessGroup | None = None,
        host_size: int = 1,
        global_every: int = 1,
        threshold: float = 0.0,
        elastic: ElasticAverager | None = None,
    ) -> None:
        super().__init__(inner, params, world_size=world_size, period=period, warmup=warmup)
        #: ``restart.mode: in_place``: the rounds go over groups that outlive a lost
        #: worker (:mod:`dmlctl.strategies.elastic`); parameters only.
        self.elastic = elastic
        self.tensors: list[torch.Tensor] = list(self.params)  # + buffers, first round
        self.n_params = sum(p.numel() for p in self.params)
        self.host_group = host_group
        self.host_size = host_size
        self.global_every = global_every
        self.filter = ChangeFilter(self.tensors, threshold) if threshold > 0 else None
        self.last_sent: list[int] = []  # indices into tensors the latest filtered round sent
        self._averaged_at: int | None = None  # the step of the latest elastic round

    def is_global_round(self) -> bool:
        """Whether the round due now averages over all workers (else: the host)."""
        since = self.local_steps - self.warmup
        return since <= 0 or since % (self.period * self.global_every) == 0

    def communicate(self) -> None:
        """The round due now: a global one (the tensors the ``threshold`` filter
        picks, or all; :func:`~dmlctl.strategies.common.average_round`), else an
        average over this host's workers (none when it runs one)."""
        if self.elastic is not None:
            self._elastic_round("after averaging")
            return
        with_exchanged_buffers(self, self.tensors, self.filter)
        if self.is_global_round():
            chosen = average_round(self, self.tensors, self.filter)
            if self.filter is not None:
                self.last_sent = chosen
            return
        if self.host_group is None or self.host_size <= 1:
            return  # one worker on this host: a host round is a no-op
        mean, spread = mean_and_consensus(
            self.tensors, self.n_params, self.meter, self.host_group, self.host_size
        )
        self.meter.extra["consensus_host"] = spread
        assign_flat(self.tensors, mean)
        self.check_finite(mean, self.tensors, "after host averaging")

    def final_model(self) -> None:
        """Every worker ← the mean of all workers' parameters and buffers (one
        all-reduce over all workers, hosts included). In place: the parameters', none
        when the latest round was at this step (a replacement may have joined it)."""
        if self.elastic is not None:
            if self._averaged_at != self.local_steps:  # else the last round was at this step
                self._elastic_round("in the final average")
            return
        tensors = with_exchanged_buffers(self, self.tensors, self.filter)
        mean = average_in_place(tensors, self.meter, self.world_size)
        if mean is not None:
            self.check_finite(mean, tensors, "in the final average")

    def joining_round(self) -> int:
        """A replacement's first round (weight 0): the others' mean; the round's step."""
        assert self.elastic is not None
        self._averaged_at = self.elastic.average(self.params, 0, self.meter, joining=True)[1]
        return self._averaged_at

    def _elastic_round(self, where: str) -> None:
        """A round over the elastic group: the parameters become their mean."""
        assert self.elastic is not None
        mean, _ = self.elastic.average(self.params, self.local_steps, self.meter)
        self._averaged_at = self.local_steps
        self.check_finite(mean, self.params, where)

    def shown_settings(self) -> dict[str, object]:
        """The period, the warm-up and how often a round is global."""
        shown = {"warmup": self.warmup, "global_every": self.global_every}
        return {**super().shown_settings(), **shown}


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Broadcast rank 0's model and wrap ``optimizer`` in a ``LocalSGDOptimizer``.

    Promises: see the module docstring. ``model`` must already be on ``ctx.device``;
    the optimizer must be built on its parameters."""
    p = params_as(Params, params)
    weights = elastic_start.starting_weights(ctx, model)
    if weights is None:
        return model, optimizer
    host_group, host_size, global_every = None, 1, 1
    if p.hierarchical:
        # torch's HierarchicalModelAverager does not fit the StrategyOptimizer hook: it
        # keeps its own step counter, skips averaging during warm-up (it expects DDP to
        # sync gradients then), neither exposes the mean (needed for the consensus
        # distance) nor counts bytes, and builds equal-size subgroups from the CUDA
        # device count. Same for PeriodicModelAverager. So: one flat all_reduce per
        # round, over a host subgroup made with torch's new_subgroups_by_enumeration.
        host_group, host_size = host_subgroup(ctx)
        multi_host = host_size < ctx.world_size
        global_every = p.hierarchy_factor if multi_host else 1
    opt = LocalSGDOptimizer(
        optimizer,
        weights,
        world_size=ctx.world_size,
        period=p.period,
        warmup=p.warmup_steps,
        host_group=host_group,
        host_size=host_size,
        global_every=global_every,
        threshold=p.threshold,
        elastic=elastic_start.averager(ctx),  # restart.mode: in_place (not hierarchical)
    )
    if opt.elastic is not None:
        elastic_start.begin(ctx, opt, opt.elastic, "local-sgd", opt.joining_round, model=model)
    return model, opt
