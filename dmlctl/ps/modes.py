"""What a parameter-server worker sends, and when: the generic push modes, each a
:class:`~dmlctl.ps.worker.PSOptimizer` shared by several strategies (runtime side, torch).

* :class:`DeltaPush` (asgd, ssp): the user's optimizer steps locally; every ``n_push``
  steps the worker pushes its *delta* — its parameters minus the reference copy taken
  at its last push or pull — and the server adds it with the layout's weight; every
  ``n_fetch`` steps it pulls and continues from the server's parameters plus the local
  change not pushed yet. With plain SGD and ``n_push = n_fetch = 1`` the delta is
  ``-lr·g``: Downpour's gradient push. Optimizer state (momentum, Adam moments) stays
  on the worker.
* :class:`GradientPush` (adadelay; sync-ps's worker extends it): the user's optimizer
  does not step; the worker pushes its gradients every step and the server's rule
  makes the step; it pulls every ``n_fetch`` steps.

A strategy's own worker lives in its package: easgd-async's
:mod:`dmlctl.strategies.easgd_async.mode`, aadmm's :mod:`dmlctl.strategies.aadmm.mode`,
sync-ps's :mod:`dmlctl.strategies.sync_ps.mode`.

With ``overlap: true`` (asgd) every exchange runs in the communication thread of
:mod:`dmlctl.ps.overlap` while the trainer computes, and the model it pulls is taken
at the next exchange.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from dmlctl.ps.worker import PSOptimizer, Wiring


class DeltaPush(PSOptimizer):
    """Local steps; push the change every ``n_push`` steps, pull every ``n_fetch``.
    With ``overlap`` each push and pull runs in the communication thread while the
    trainer takes its next step, and the model it pulled is taken at the next
    exchange (with the local change made since)."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        wiring: Wiring,
        *,
        n_push: int = 1,
        n_fetch: int = 1,
    ) -> None:
        super().__init__(inner, params, wiring)
        self.n_push, self.n_fetch = n_push, n_fetch

    def _delta(self) -> list[torch.Tensor]:
        return [p.detach() - r for p, r in zip(self.params, self.reference, strict=True)]

    def _mark_pushed(self) -> None:
        with torch.no_grad():
            for p, r in zip(self.params, self.reference, strict=True):
                r.copy_(p)

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """The local step, then the push and the pull that are due (module docstring)."""
        loss = self._local_step(closure)
        push = self.local_steps % self.n_push == 0
        fetch = self.local_steps % self.n_fetch == 0
        if self.comm is not None:
            if push or fetch:
                self._exchange_behind(push, fetch)
            return loss
        fresh = None
        if push:
            fresh = self._push(self._delta(), pull=fetch)
            self._mark_pushed()
        if fetch:
            pulled = fresh if fresh is not None else self._pull()
            self.settled(pulled)
        return loss

    def _exchange_behind(self, push: bool, fetch: bool) -> None:
        """``overlap``: take the previous exchange's model, then start this one."""
        self.settle()
        if push:
            delta = self._delta()
            self._mark_pushed()
            self._push_behind(delta, pull=fetch)
        else:
            self._pull_behind()

    def settled(self, pulled: list[torch.Tensor] | None) -> None:
        """Continue from the servers' ``pulled`` model plus the local change not pushed
        or not delivered yet."""
        if pulled is not None:
            self._adopt(self._with_unsent(pulled), keep_local=True)

    def _with_unsent(self, pulled: list[torch.Tensor]) -> list[torch.Tensor]:
        """``pulled`` plus what this worker's push filter has held back (its error
        feedback): a change not delivered yet stays in the worker's model, as a
        change not pushed yet does, and is pushed with the next push."""
        codec = self.channel.codec
        if codec is None or not codec.state.error:
            return pulled
        numel = self.layout.shard_numel()
        flats = [
            codec.state.error.get(s, torch.zeros(numel[s])) if numel[s] else torch.zeros(0)
            for s in self.shard_ids
        ]
        unsent = self.unpack_own(flats)
        return [f + u.to(f.dtype) for f, u in zip(pulled, unsent, strict=True)]

    def flush(self) -> None:
        """Push the change since the last push, if any."""
        if self.pushed_at < self.local_steps:
            self._push(self._delta())


class GradientPush(PSOptimizer):
    """Push the gradients every step (the servers step); pull every ``n_fetch``.
    ``advice`` is the divergence hint (the servers' step size, not the unused
    optimizer's ``lr``, is what to change)."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        wiring: Wiring,
        *,
        n_fetch: int = 1,
        advice: str | None = None,
    ) -> None:
        super().__init__(inner, params, wiring)
        self.n_fetch = n_fetch
        self.advice = advice

    def divergence_advice(self) -> str:
        return self.advice if self.advice is not None else super().divergence_advice()

    def tags(self) -> dict[int, int] | None:
        """The clock each shard's push carries (None: the local steps taken)."""
        return None

    def push_lr(self) -> float | None:
        """The learning rate each push carries (None: none)."""
        return None

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """Push this step's gradients (the user's optimizer does not step) and pull
        the servers' parameters when due; returns the closure's loss, if any."""
        loss: Any = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._schedulers_taken()
        grads = [dense_grad(p) for p in self.params]
        self._counted()
        pull = self.local_steps % self.n_fetch == 0
        fresh = self._push(grads, pull=pull, clock=self.tags(), lr=self.push_lr())
        if fresh is not None:
            self._adopt(fresh, keep_local=False)
        return loss


def dense_grad(p: torch.nn.Parameter) -> torch.Tensor:
    """``p``'s gradient as a dense tensor (zeros without one); sparse ones refused."""
    if p.grad is None:
        return torch.zeros_like(p)
    if p.grad.is_sparse:
        raise RuntimeError(
            "parameter-server strategies push dense tensors; use hogwild or a dense "
            "gradient (e.g. nn.Embedding(sparse=False)) for this parameter"
        )
    return p.grad.detach()
