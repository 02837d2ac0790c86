"""Every synchronous strategy's communication round runs the divergence guard: one
worker whose parameters became NaN stops every worker at that round with ``Diverged``,
naming the strategy, the step, the parameter and the strategy's coupling weights
(2 real gloo ranks each)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch

from dmlctl.runtime.context import Context
from dmlctl.runtime.divergence import Diverged
from tests.strategies.harness import run_ranks

CASES: dict[str, tuple[dict[str, Any], str]] = {
    "local-sgd": ({"period": 2}, "after averaging; lower the learning rate (lr=0.1)"),
    "bmuf": (
        {"period": 2, "block_momentum": 0.5},
        "after the block update; lower the learning rate (lr=0.1) or the coupling"
        " weights (block_lr=1, block_momentum=0.5)",
    ),
    "easgd": (
        {"period": 2, "rho": 0.5},
        "in the center after the elastic update; lower the learning rate (lr=0.1) or"
        " the coupling weights (rho=0.5, alpha=0.45)",
    ),
    "admm": (
        {"local_steps": 2, "rho": 0.5},
        "in z after the consensus round; lower the learning rate (lr=0.1) or the"
        " coupling weights (rho=0.5)",
    ),
    "dpsgd": ({"period": 2}, "after gossip mixing; lower the learning rate (lr=0.1)"),
}


def _train_until_diverged(ctx: Context) -> str:
    """Step a tiny model; rank 1's bias becomes NaN after its first step. Returns the
    ``Diverged`` message (an empty string when no round caught it)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 1))
    model, optimizer = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    try:
        for step in range(1, 5):
            model(torch.ones(4, 3)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step == 1 and ctx.rank == 1:
                with torch.no_grad():
                    model[0].bias.fill_(math.nan)
    except Diverged as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("strategy", list(CASES))
def test_a_non_finite_parameter_stops_every_worker_at_the_round(strategy: str) -> None:
    params, tail = CASES[strategy]
    messages = run_ranks(_train_until_diverged, 2, strategy=strategy, params=params)
    where, advice = tail.split("; ", 1)
    expected = (
        rf"strategy {strategy}, step 2: parameter '0\.(weight|bias)' is not finite "
        rf"{re.escape(where)} \((\d+) NaN of (\d+) values?\); {re.escape(advice)}"
    )
    for message in messages:
        found = re.fullmatch(expected, message)
        assert found is not None, message
        assert int(found.group(2)) <= int(found.group(3)), message
