"""``sync-ps``'s worker: what it sends, and when (runtime side, torch; the servers
are :mod:`dmlctl.ps.rounds`'s ``BackupRounds``).

:class:`SyncGradientPush`: the user's optimizer does not step here (the servers run
it); every step the worker pushes its gradients tagged with the version of the
parameters it computed them on, and its optimizer's current ``lr`` (so a
learning-rate scheduler on the workers drives the servers' steps), waits until that
round is over, and continues from the servers' parameters (the servers count the
gradients they dropped, per worker).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dmlctl.ps.modes import GradientPush
from dmlctl.ps.worker import Wiring


class SyncGradientPush(GradientPush):
    """:class:`~dmlctl.ps.modes.GradientPush` with a pull every step and each push
    tagged with the version its gradients were computed on (module docstring)."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        wiring: Wiring,
        *,
        advice: str | None = None,
    ) -> None:
        super().__init__(inner, params, wiring, n_fetch=1, advice=advice)

    def tags(self) -> dict[int, int]:
        return dict(self.versions)

    def push_lr(self) -> float:
        """The user's optimizer's current ``lr`` (a scheduler may have changed it):
        the servers step with it."""
        return float(self.param_groups[0]["lr"])
