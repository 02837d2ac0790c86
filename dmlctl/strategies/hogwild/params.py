"""The parameters of a ``hogwild`` job (none) and its one-host check (torch-free: the
control plane imports it). The strategy is :mod:`dmlctl.strategies.hogwild.strategy`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from dmlctl.strategies.params import WORKERS_ONLY

ROLES: tuple[str, ...] = WORKERS_ONLY
#: The workers train on the CPU even on a GPU host: they share parameters through
#: the host's memory.
HOST_MEMORY = True


class Params(BaseModel):
    """``strategy.params`` of a ``hogwild`` job: none (unknown keys are errors)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def check_hosts(params: BaseModel, n_hosts: int) -> str | None:
    """Why the job cannot run on ``n_hosts`` hosts (hogwild needs one), or None."""
    del params
    if n_hosts > 1:
        return (
            "hogwild shares parameters through the memory of one host, but the job "
            f"would run on {n_hosts} hosts: set max_hosts: 1 or fewer workers "
            "(at most one host's slots)"
        )
    return None
