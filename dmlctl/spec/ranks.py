"""The ``ranks:`` block of a job file: how each rank's process starts (pure model)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from dmlctl.spec.fields import FROZEN

__all__ = ["RANK_STARTS", "RanksSpec"]

RankStart = Literal["fresh", "warm"]
"""How a rank's process starts: see :attr:`RanksSpec.start`."""
RANK_STARTS: tuple[RankStart, ...] = ("fresh", "warm")


class RanksSpec(BaseModel):
    """How the ranks start."""

    model_config = FROZEN

    start: RankStart = "fresh"
    """'fresh' (the default): each rank is a new interpreter started as torchrun starts it, so the
    script sees exactly torchrun's world. 'warm': each rank is forked from a process that has
    imported torch and dmlctl's runtime already, which saves each rank that import (about a second
    of a core). Under 'warm' torch is imported before the script runs: variables torch reads as it
    is imported (OMP_NUM_THREADS, MKL_NUM_THREADS, TORCH_LOGS, ...) belong in the job's env:, not
    in the script."""
