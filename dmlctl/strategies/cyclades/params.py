"""The parameters of a ``cyclades`` job and its one-host check (torch-free: the
control plane imports it). The strategy is :mod:`dmlctl.strategies.cyclades.strategy`."""

from __future__ import annotations

from pydantic import BaseModel, Field

from dmlctl.strategies.params import (
    PARAMS_CONFIG,
    WORKERS_ONLY,
    Capabilities,
    derived_steps,
    one_host,
)

QUALITY = (
    "for sparse models: on `dmlctl bench sparse` it reaches hogwild's loss without "
    "conflicting updates. Not on the quality tables: their models are dense, and a "
    "dense parameter or momentum is refused."
)
#: The workers train on the CPU even on a GPU host: they share parameters through
#: the host's memory.

MAX_FIELD = 64
"""Largest sample field index ``coordinates`` may name."""


class Params(BaseModel):
    """``strategy.params`` of a ``cyclades`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    sample_size: int | None = derived_steps(
        "features / active², from the data",
        "B: updates (samples) sampled per round, split into conflict-free components. "
        "Small enough that no component takes most of a round: the default gives a "
        "sampled update about one conflict on average (features = the largest "
        "coordinate + 1, active = mean coordinates per sample, over the first 1,000 "
        "samples of each epoch).",
    )
    coordinates: int = Field(default=0, ge=0, le=MAX_FIELD)
    """Which field of a sample holds the coordinates its update touches (an integer tensor of
    feature indices, e.g. the input of an nn.EmbeddingBag)."""


check_hosts = one_host("cyclades")
"""Why the job cannot run on that many hosts (cyclades needs one), or None."""


CAPABILITIES = Capabilities(roles=WORKERS_ONLY, host_memory=True, check_hosts=check_hosts)
