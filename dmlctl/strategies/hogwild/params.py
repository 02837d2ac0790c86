"""The parameters of a ``hogwild`` job (none) and its one-host check (torch-free: the
control plane imports it). The strategy is :mod:`dmlctl.strategies.hogwild.strategy`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from dmlctl.strategies.params import WORKERS_ONLY, Capabilities, one_host

QUALITY = (
    "the language model ends +4.3 % with AdamW and −2.9 % with SGD + Nesterov against "
    "one process's validation loss after 3 epochs (asynchronous, so it moves from run "
    "to run: AdamW +2.1 to +4.3 % in four runs, around the 3 % bound): each worker "
    "keeps its own AdamW state and takes whole steps on the shared parameters; after "
    "6 epochs +0.5 % with AdamW and −1.5 % with SGD + Nesterov, after 9 −1.6 % and "
    "−0.4 %. Digits within 0.3 points."
)
#: The workers train on the CPU even on a GPU host: they share parameters through
#: the host's memory.


class Params(BaseModel):
    """``strategy.params`` of a ``hogwild`` job: none (unknown keys are errors)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


check_hosts = one_host("hogwild")
"""Why the job cannot run on that many hosts (hogwild needs one), or None."""


CAPABILITIES = Capabilities(roles=WORKERS_ONLY, host_memory=True, check_hosts=check_hosts)
