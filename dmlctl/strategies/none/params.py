"""``none``: plain torchrun semantics — dmlctl applies no training strategy.

The script runs exactly as under torchrun (it may build its own DDP, FSDP, or
anything else); :meth:`Context.prepare` only moves the model to the rank's device.
This is what ``dmlctl status`` shows for a run whose script never let a strategy wrap
its model. This module is torch-free (the control plane imports it);
:mod:`dmlctl.strategies.none.strategy` is the (empty) strategy.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from dmlctl.strategies.params import WORKERS_ONLY, Capabilities

QUALITY = (
    "nothing to compare: dmlctl applies no strategy. It runs the single-process "
    "baseline of both quality tables (`dmlctl bench accuracy`, digits and `--task "
    "lm`)."
)


class Params(BaseModel):
    """``none`` has no parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")


CAPABILITIES = Capabilities(roles=WORKERS_ONLY, needs_runtime=False)
