"""``easgd-async``'s worker: what it sends, and when (runtime side, torch; the
server is :mod:`dmlctl.ps.server` with a ``scaled_add`` rule of weight 1).

:class:`ElasticExchange`: local steps with the user's optimizer; every ``period``
steps the worker pulls the center ``x̃``, moves ``x ← x − α(x − x̃)`` and pushes
``α(x − x̃)``, which the server adds to the center (the paper's asynchronous elastic
exchange).

With ``overlap: true`` every exchange runs in the communication thread of
:mod:`dmlctl.ps.overlap` while the trainer computes, and the center it pulls is taken
at the next exchange.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from dmlctl.ps.worker import PSOptimizer, Wiring


class ElasticExchange(PSOptimizer):
    """Local steps; every ``period`` steps an elastic exchange with the center. With
    ``overlap`` the exchange uses the center the previous exchange pulled (right
    after its own push) and its push and pull run in the communication thread while
    the trainer goes on."""

    coupling: ClassVar[dict[str, str]] = {"alpha": "elastic_alpha"}

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        wiring: Wiring,
        *,
        period: int,
        alpha: float,
    ) -> None:
        super().__init__(inner, params, wiring)
        self.elastic_period, self.elastic_alpha = period, alpha
        self._center: list[torch.Tensor] | None = None  # overlap: the latest pulled center

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """The local step, then the exchange when due (module docstring)."""
        loss = self._local_step(closure)
        if self.local_steps % self.elastic_period == 0:
            self._exchange()
        return loss

    def _exchange(self) -> None:
        if self.comm is not None:
            self.settle()
            center = self._center if self._center is not None else self._pull()
        else:
            center = self._pull()
        with torch.no_grad():
            diff = [
                self.elastic_alpha * (p.detach() - c)
                for p, c in zip(self.params, center, strict=True)
            ]
            for p, d in zip(self.params, diff, strict=True):
                p.sub_(d)
        self.check_finite(self.params, where="after the elastic exchange")
        if self.comm is not None:
            self._push_behind(diff, pull=True)
        else:
            self._push(diff)

    def settled(self, pulled: list[torch.Tensor] | None) -> None:
        """Keep the center the background exchange pulled, for the next exchange."""
        if pulled is not None:
            self._center = pulled
