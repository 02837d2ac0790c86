"""``aadmm``'s worker: what it sends, and when (runtime side, torch; the servers are
:mod:`dmlctl.ps.rounds`'s ``ConsensusRounds``).

:class:`ConsensusExchange`: ``local_steps`` steps of the user's optimizer on
``fₖ(w) + λₖᵀ(w − z) + ρ/2‖w − z‖²`` (the penalty's gradient ``ρ(w − z + u)``,
``u = λ/ρ``, is added to the gradients before each step), then a push of
``v = w + u``, a wait for the z-update that includes it, and the dual update
``u ← u + w − z`` (``λ ← λ + ρ(w − z)``). Reported: ``primal_res``, this worker's
``‖w − z‖`` at its latest round. With ``overlap: true`` the push and the wait for z
run in the communication thread (:mod:`dmlctl.ps.overlap`) while the next round's
local steps go on; the z (and the dual update with the pushed w) is taken before the
first step after it arrived.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from dmlctl.ps.worker import PSOptimizer, Wiring


class ConsensusExchange(PSOptimizer):
    """Asynchronous consensus ADMM's worker (module docstring)."""

    coupling: ClassVar[dict[str, str]] = {"rho": "rho"}

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        wiring: Wiring,
        *,
        rho: float,
        local_steps: int,
    ) -> None:
        super().__init__(inner, params, wiring)
        self.rho, self.round_steps = rho, local_steps
        self.z = [p.detach().clone() for p in self.params]
        self.u = [torch.zeros_like(p) for p in self.params]
        self._pushed_w: list[torch.Tensor] | None = None  # overlap: w of the round in flight

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """A proximal step of the user's optimizer; a round every ``local_steps``.
        With overlap, the z of the round in flight is taken before the first step
        after it arrived (see :meth:`_round`)."""
        if self.comm is not None and self.comm.ready:
            self.settle()
        with torch.no_grad():
            for p, z, u in zip(self.params, self.z, self.u, strict=True):
                if p.grad is not None:
                    p.grad.add_(p.detach() - z + u, alpha=self.rho)
        loss = self._local_step(closure)
        if self.local_steps % self.round_steps == 0:
            self._round(behind=self.comm is not None)
        return loss

    def _round(self, behind: bool = False) -> None:
        """Push ``v = w + u``; once the new z is in, ``u ← u + w − z`` with that ``w``.
        ``behind`` (overlap): the previous round's z is waited for if it has not
        arrived yet, then this push and the wait for its z run in the communication
        thread while the next round's steps go on with the z and u the worker holds;
        the z is taken, and the dual updated with the pushed ``w``, before the first
        step after it arrived. The math is consensus ADMM's; only the first steps of
        a round may still use the previous round's z and u."""
        if behind:
            self.settle()
        with torch.no_grad():
            w = [p.detach().clone() for p in self.params]
            v = [x + u for x, u in zip(w, self.u, strict=True)]
        if behind:
            self._pushed_w = w
            self._push_behind(v, pull=True, clock=dict(self.versions))
            return
        z = self._push(v, pull=True, clock=dict(self.versions))
        assert z is not None
        self._take_z(w, z)

    def settled(self, pulled: list[torch.Tensor] | None) -> None:
        """The z of the round in flight, with the dual update for the ``w`` it pushed."""
        if pulled is not None and self._pushed_w is not None:
            self._take_z(self._pushed_w, pulled)
            self._pushed_w = None

    def _take_z(self, w: Sequence[torch.Tensor], z: list[torch.Tensor]) -> None:
        """z ← the round's new z; ``u ← u + w − z`` (``λ ← λ + ρ(w − z)``) for the
        ``w`` that round pushed; ``primal_res`` = ``‖w − z‖``."""
        self.check_finite(z, where="in z after the consensus round")
        gap = 0.0
        with torch.no_grad():
            for x, u, fresh in zip(w, self.u, z, strict=True):
                r = x - fresh
                u.add_(r)
                gap += float(r.double().square().sum())
        self.z = z
        self.meter.extra["primal_res"] = math.sqrt(gap)

    def flush(self) -> None:
        """A last round when steps were taken since the previous one."""
        if self.pushed_at < self.local_steps:
            self._round()

    def final_pull(self, pulled: Sequence[torch.Tensor]) -> None:
        """z ← the servers' final z (the other workers' last rounds included); the
        parameters take it unless ``final: local``."""
        self.z = [t.clone() for t in pulled]
        super().final_pull(pulled)

    def strategy_state(self) -> dict[str, Any]:
        state = super().strategy_state()
        state.update(z=[t.clone() for t in self.z], u=[t.clone() for t in self.u])
        return state

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        for name in ("z", "u"):
            saved = state.get(name)
            if saved is not None:
                setattr(self, name, [t.clone() for t in saved])
        super().load_strategy_state(state)

    def shown_settings(self) -> dict[str, object]:
        """ρ and the local steps per round."""
        return {"rho": f"{self.rho:g}", "local_steps": self.round_steps}
