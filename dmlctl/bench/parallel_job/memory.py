"""What a rank of ``dmlctl bench parallel`` holds of the model, in bytes (rank side,
torch).

* **parameters** — every parameter of this rank's model once: a DTensor counts its
  local shard (tensor parallelism, FSDP2), a pipeline rank only its own stages;
* **optimizer** — every tensor in the optimizer's state for those parameters
  (AdamW: ``exp_avg``, ``exp_avg_sq`` — local shards for DTensors — and ``step``),
  so measured after the first optimizer step, when the state exists;
* **sharded layers** — both of the above restricted to the parameters of the layers
  dmlctl's default tensor plan splits (:func:`split_names`), whatever the layout.

:func:`reference` measures the same on the whole model in this one process, with the
same optimizer. Transient memory (FSDP2's all-gathered parameters, activations,
gradients) is not counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from dmlctl.bench.parallel_job.model import Config, loss_fn, transformer
from dmlctl.runtime.parallel.tensor import default_plan

_WRAPPERS = re.compile(r"^(module\.|stages\.\d+\.)+")
"""Prefixes that wrappers add to a parameter's name: DDP's ``module.``, a pipeline
rank's ``stages.<i>.`` (its stages keep the whole model's names under it)."""


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the part of ``tensor`` this rank holds (a DTensor's local shard)."""
    held = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return int(held.numel()) * held.element_size()


def whole_name(name: str) -> str:
    """``name`` of a parameter of a wrapped model as the whole model names it."""
    return _WRAPPERS.sub("", name)


def split_names(model: nn.Module, degree: int = 2) -> frozenset[str]:
    """Names of the parameters of the layers dmlctl's default tensor plan splits
    ``degree`` ways in ``model`` (the whole, unwrapped model)."""
    plan = default_plan(model, degree)
    return frozenset(
        name for name, _ in model.named_parameters() if name.rpartition(".")[0] in plan
    )


def _state_bytes(state: Iterable[object]) -> int:
    return sum(local_bytes(v) for v in state if isinstance(v, torch.Tensor))


def held(
    model: nn.Module, optimizer: torch.optim.Optimizer, split: frozenset[str]
) -> dict[str, int]:
    """``param_bytes``, ``optim_bytes`` and ``sharded_bytes`` (parameters and
    optimizer state of the layers named in ``split``) this rank holds of ``model``
    and ``optimizer`` (each tensor once)."""
    params = {id(p): (whole_name(n), p) for n, p in model.named_parameters()}
    out = {"param_bytes": 0, "optim_bytes": 0, "sharded_bytes": 0}
    for name, p in params.values():
        mine = local_bytes(p)
        state = _state_bytes(optimizer.state.get(p, {}).values())
        out["param_bytes"] += mine
        out["optim_bytes"] += state
        if name in split:
            out["sharded_bytes"] += mine + state
    return out


def reference(cfg: Config, split: frozenset[str], lr: float) -> dict[str, int]:
    """:func:`held` of the whole model with AdamW after one step in this process, its
    keys prefixed ``model_``; the global RNG state is left as it was."""
    with torch.random.fork_rng():
        model = transformer(cfg)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        ids = torch.randint(cfg.vocab, (2, cfg.context))
        torch.autograd.backward(loss_fn(model(ids), ids))
        optimizer.step()
        return {f"model_{k}": v for k, v in held(model, optimizer, split).items()}
