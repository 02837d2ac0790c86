"""The parameters of an ``asgd`` job (torch-free: the control plane validates job
files with it). The strategy is :mod:`dmlctl.strategies.asgd.strategy`."""

from __future__ import annotations

from dmlctl.strategies.params import (
    PARAMS_CONFIG,
    FetchEvery,
    Overlap,
    PushCompression,
    Steps,
    derived_weight,
    server_capabilities,
)

QUALITY = (
    "the language model ends +6.1 % with AdamW and +1.4 % with SGD + Nesterov against "
    "one process's validation loss after 3 epochs (asynchronous: AdamW +5.3 to +6.4 % "
    "in four runs), more than 3 % with AdamW: each worker's AdamW step is computed on "
    "parameters a push old; after 6 epochs +0.1 % with AdamW and +0.5 % with SGD + "
    "Nesterov, after 9 −0.6 % and +0.9 %. Digits within 0.3 points."
)


class Params(PushCompression, Overlap):
    """``strategy.params`` of an ``asgd`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    n_push: Steps = 1
    """Push the local change every n_push steps."""
    n_fetch: FetchEvery = 1
    scale: float | None = derived_weight(
        "1/workers",
        "Weight the servers give a pushed change; default 1/workers (1: Downpour's plain "
        "sum, p times the step of synchronous SGD).",
    )


CAPABILITIES = server_capabilities(parallelism=True)
