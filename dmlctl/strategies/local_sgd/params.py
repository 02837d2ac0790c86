"""The parameters of a ``local-sgd`` job (torch-free: the control plane validates job
files with it). The update rule is :mod:`dmlctl.strategies.local_sgd.strategy`'s."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from dmlctl.strategies.params import (
    MAX_PERIOD,
    MAX_STEPS,
    PARAMS_CONFIG,
    WORKERS_ONLY,
    Averaging,
    Capabilities,
    at_least,
    threshold_in_place,
)

QUALITY = (
    "the language model (3 epochs) ends +1.6 % with AdamW and −0.0 % with SGD + "
    "Nesterov against one process's validation loss (bound 3 %), digits within 0.3 "
    "points."
)


class Params(Averaging):
    """``strategy.params`` of a ``local-sgd`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    period: int = Field(le=MAX_PERIOD, default=8)
    """H: local steps between two model averages. Communication per step is 1/H of synchronous
    SGD's; larger H lets the replicas drift further apart."""
    warmup_steps: int = Field(le=MAX_STEPS, default=0)
    """Synchronous steps (average after every step) before local steps begin: post-local SGD. Helps
    when early training is sensitive to drift."""
    hierarchical: bool = False
    """With several workers per host: average within each host every `period` steps and across hosts
    every `period * hierarchy_factor` steps."""
    hierarchy_factor: int = Field(le=MAX_PERIOD, default=4)
    """With `hierarchical`: host-level rounds per global round."""

    _period = field_validator("period")(at_least("period", 1, "local steps between averages"))
    _warmup = field_validator("warmup_steps")(at_least("warmup_steps", 0))
    _factor = field_validator("hierarchy_factor")(at_least("hierarchy_factor", 1))

    @model_validator(mode="after")
    def _threshold_is_global(self) -> Params:
        if self.threshold > 0 and self.hierarchical:
            raise ValueError(
                "threshold filters global rounds only; it cannot be combined with hierarchical"
            )
        return self


def _in_place_rule(params: Params) -> str | None:
    """Why ``restart.mode: in_place`` cannot take these params (None: it can)."""
    if params.hierarchical:
        return "with hierarchical: true (its host rounds run in subgroups)"
    return threshold_in_place(params)


CAPABILITIES = Capabilities(
    roles=WORKERS_ONLY,
    columns=("consensus",),
    in_place=True,
    in_place_rule=_in_place_rule,
)
