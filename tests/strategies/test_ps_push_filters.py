"""Encoded parameter-server pushes on real gloo ranks: the bytes a worker moves per step
are exact (the encoded push plus the plain pull), and the servers apply what the
workers meant to send, up to the error the workers carry forward."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.strategies.harness import run_ranks

pytestmark = pytest.mark.integration

W2S1 = ["worker", "worker", "server"]
N = 256 * 256 + 256  # Linear(256, 256): one shard of two tensors
PULL = 4 * N
PUSH = {
    "none": 4 * N,
    "int8": N + 4,
    "topk": 8 * math.ceil(0.01 * N),
    "sign": math.ceil(N / 8) + 4 * 2,
}


def _bytes(ctx: Any) -> dict[str, float]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    model, opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    gen = torch.Generator().manual_seed(ctx.rank)
    for step in range(6):
        if step == 2:
            opt.metrics()  # a new window
        x = torch.randn(8, 256, generator=gen)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    out: dict[str, float] = opt.metrics()
    opt.finish()
    return out


@pytest.mark.parametrize("push", list(PUSH))
def test_bytes_per_step_are_the_encoded_push_and_the_pull(push: str) -> None:
    params = {} if push == "none" else {"push_compression": push}
    out = run_ranks(_bytes, 3, strategy="asgd", params=params, roles=W2S1)
    for worker in out[:2]:
        assert worker["comm_bytes_per_step"] == PUSH[push] + PULL, push
