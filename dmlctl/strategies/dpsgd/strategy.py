"""D-PSGD: decentralized parallel SGD by gossip with neighbours (Lian et al., 2017).

Every worker holds its own model ``xᵢ``; there is no central copy and no global
collective in the training path. With a doubly stochastic mixing matrix ``W`` over a
topology (:mod:`dmlctl.strategies.topology`) the update is

    xᵢ ← Σⱼ Wᵢⱼ xⱼ − γ ∇fᵢ(xᵢ)

Order, as in the paper: the script computes the gradient at the current ``xᵢ``
(``loss.backward()``); ``optimizer.step()`` then first **mixes** the parameters with
the neighbours' (``xᵢ ← Σⱼ Wᵢⱼ xⱼ``) and then lets the user's optimizer apply that
gradient to the mixed parameters. For plain SGD this is exactly the update above;
with momentum or Adam the optimizer's update direction replaces ``γ ∇fᵢ``. Mixing
happens on steps ``period, 2·period, …`` (every step by default); the steps in
between are purely local.

Promises:

* **Point-to-point only.** A mixing round sends this worker's parameters as one
  flat buffer to each neighbour and receives one from each, through
  ``dist.batch_isend_irecv``, and waits on every work object (gloo's point-to-point
  work has no futures). ``comm_bytes_per_step`` counts the bytes sent:
  ``#neighbours × parameter bytes`` per mixing round.
* **Mean preserved.** ``W`` is doubly stochastic, so a mixing round leaves the mean
  of the workers' models unchanged (up to float rounding); on a connected graph
  repeated rounds shrink the consensus distance towards 0.
* **Same start.** :func:`prepare` broadcasts rank 0's parameters once (at wrap time,
  not in the training path), so all replicas start identical.
* **Monitoring.** Every ``consensus_every`` steps ``consensus`` =
  sqrt(meanᵢ ‖xᵢ − x̄‖²) is measured after the step (one all-reduce of the flat
  parameters plus a scalar all-reduce) and reported through ``ctx.log``. This is
  monitoring, not training traffic: neither its bytes nor its time are counted in
  ``comm_bytes_per_step`` / ``comm_share``. ``consensus_every: 0`` turns it off.
* Every worker must take the same number of optimizer steps (mixing rounds pair
  up point-to-point messages), as ``ctx.shard`` arranges.
* Only parameters are mixed; buffers (e.g. BatchNorm statistics) stay local until the
  final average, which covers those that change in training
  (:mod:`dmlctl.runtime.buffers`). The
  model must be on ``ctx.device`` and hold parameters of a single dtype.

With ``restart.mode: in_place`` the rounds go over a group that outlives a lost
worker instead (:mod:`dmlctl.strategies.dpsgd.in_place`). The parameters are
:mod:`dmlctl.strategies.dpsgd.params`'s; this module imports torch (hosts only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from pydantic import BaseModel

from dmlctl.runtime import rejoin
from dmlctl.strategies.dpsgd.gossip import DPSGDOptimizer
from dmlctl.strategies.dpsgd.params import Params
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Keep ``model`` as it is and wrap ``optimizer`` in D-PSGD's mixing optimizer.

    Promises: the model comes back unchanged (no wrapper; with more than one worker
    its parameters are first overwritten by rank 0's, one broadcast per tensor). The
    returned optimizer steps the user's optimizer and mixes with the topology's
    neighbours as the module docstring says; ``state_dict()`` holds the user's
    optimizer state and the step count. At world size 1 it only counts steps
    (no communication, ``consensus`` = 0).
    """
    p = params_as(Params, params)
    if rejoin.in_place() and ctx.world_size > 1:
        from dmlctl.strategies.dpsgd import in_place  # a subclass of this module's

        return in_place.prepare(ctx, model, optimizer, p)
    tensors = list(model.parameters())
    if ctx.world_size > 1:
        for tensor in tensors:
            dist.broadcast(tensor.data, src=0)
    wrapped = DPSGDOptimizer(
        optimizer, tensors, rank=ctx.rank, world_size=ctx.world_size, settings=p
    )
    return model, wrapped
