"""How a parameter server applies one pushed tensor to a shard (runtime side, torch).

* :class:`ScaledAdd` — ``flat += alpha · update``. With ``alpha = -lr`` and a
  gradient this is SGD; with a positive weight and a worker's *delta* (its parameters
  after its local steps minus before) it is Downpour-style model-delta averaging
  (asgd, ssp) or, with weight 1, the elastic exchange of asynchronous EASGD.
* :class:`AdaDelay` — the delay-adaptive step of Sra, Yu, Li & Smola, "AdaDelay:
  Delay Adaptive Distributed Stochastic Optimization" (AISTATS 2016): the gradient
  ``g`` of an update that arrives as the shard's ``t``-th update (1-based) with
  measured delay ``τ`` moves coordinate ``j`` by ``-α_j(t, τ) g_j`` with

      α_j(t, τ) = 1 / (L + c_j(t) · √(t + τ))
      c_j(t)    = c · √( (1/t) Σ_{k≤t} (τ_k + 1) g_{k,j}² )

  ``c_j`` is the paper's per-coordinate adaptive constant: the delay-weighted mean
  square of the gradients seen so far (``τ_k + 1`` rather than ``τ_k``, so updates
  that arrive without delay still count). For fixed state, ``α`` strictly decreases
  as ``τ`` grows wherever ``c_j > 0``: a stale gradient takes a smaller step.

A rule's ``state_dict`` holds only tensors and numbers (it travels in checkpoints).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import torch


class UpdateRule(Protocol):
    """Applies updates to shards; keeps whatever per-shard state it needs."""

    def apply(
        self, shard_id: int, flat: torch.Tensor, update: torch.Tensor, version: int, staleness: int
    ) -> None:
        """Update ``flat`` in place with ``update``; ``version`` is the number of
        updates the shard has had so far, ``staleness`` this update's delay."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class ScaledAdd:
    """``flat += alpha · update`` (stateless)."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha

    def apply(
        self, shard_id: int, flat: torch.Tensor, update: torch.Tensor, version: int, staleness: int
    ) -> None:
        del shard_id, version, staleness
        flat.add_(update, alpha=self.alpha)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        del state


class AdaDelay:
    """AdaDelay's step (module docstring) with smoothness constant ``L`` (> 0: the
    largest step is ``1/L``) and scale ``c`` (>= 0) of the adaptive term."""

    def __init__(self, L: float, c: float = 1.0) -> None:
        if not L > 0 or c < 0:
            raise ValueError(f"AdaDelay needs L > 0 and c >= 0, got L={L}, c={c}")
        self.L, self.c = L, c
        self.sq: dict[int, torch.Tensor] = {}  # Σ (τ+1) g² per coordinate, per shard
        self.last_step: dict[int, float] = {}  # mean α of the shard's latest update

    def step_sizes(
        self, shard_id: int, update: torch.Tensor, t: int, staleness: int
    ) -> torch.Tensor:
        """α for every coordinate of the shard's ``t``-th update (1-based) with delay
        ``staleness``, given the squares accumulated *including* this update."""
        sq = self.sq[shard_id]
        c = self.c * torch.sqrt(sq / t)
        return 1.0 / (self.L + c * math.sqrt(t + staleness))

    def apply(
        self, shard_id: int, flat: torch.Tensor, update: torch.Tensor, version: int, staleness: int
    ) -> None:
        sq = self.sq.get(shard_id)
        if sq is None:
            sq = self.sq[shard_id] = torch.zeros_like(flat)
        sq.addcmul_(update, update, value=float(staleness + 1))
        alpha = self.step_sizes(shard_id, update, version + 1, staleness)
        flat.addcmul_(alpha, update, value=-1.0)
        self.last_step[shard_id] = float(alpha.mean()) if alpha.numel() else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"sq": {s: t.clone() for s, t in self.sq.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sq = {int(s): t.clone() for s, t in state.get("sq", {}).items()}
