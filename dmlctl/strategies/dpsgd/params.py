"""The parameters of a ``dpsgd`` job (torch-free: the control plane validates job
files with it). The update rule is :mod:`dmlctl.strategies.dpsgd.strategy`'s; the
topologies are :mod:`dmlctl.strategies.topology`'s."""

from __future__ import annotations

from typing import Literal

from dmlctl.strategies.params import (
    PARAMS_CONFIG,
    WORKERS_ONLY,
    Capabilities,
    Count,
    FinalModel,
    Steps,
)

QUALITY = (
    "the language model (3 epochs) ends −0.5 % with AdamW and +1.8 % with SGD + "
    "Nesterov against one process's validation loss (bound 3 %), digits within 0.8 "
    "points."
)

Topology = Literal["ring", "exponential", "complete"]


class Params(FinalModel):
    """``strategy.params`` of a ``dpsgd`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    topology: Topology = "ring"
    """Who mixes with whom: 'ring' (2 neighbours, weight 1/3 each), 'exponential' (neighbours at
    distance ±2^k, O(log n) peers) or 'complete' (everyone, 1/n: equals global averaging)."""
    period: Steps = 1
    """Mix parameters with the neighbours every this many optimizer steps; the steps in between are
    local only."""
    consensus_every: Count = 10
    """Measure the consensus distance sqrt(mean ||x_i - mean||^2) every this many steps (one
    all-reduce, monitoring only, not counted as training traffic); 0 = never."""


CAPABILITIES = Capabilities(roles=WORKERS_ONLY, columns=("consensus",), in_place=True)
