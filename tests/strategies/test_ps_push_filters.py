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


@pytest.mark.parametrize(("threshold", "push"), [(1e-9, 1 + 4 * N), (100.0, 1)])
def test_a_threshold_push_is_its_mask_and_the_tensors_it_sends(threshold: float, push: int) -> None:
    """A tiny threshold sends both tensors every step (mask + 4 bytes per element), a
    huge one neither (the mask byte alone)."""
    params = {"push_compression": "threshold", "push_threshold": threshold}
    out = run_ranks(_bytes, 3, strategy="asgd", params=params, roles=W2S1)
    for worker in out[:2]:
        assert worker["comm_bytes_per_step"] == push + PULL, threshold


def _trajectory(ctx: Any, steps: int) -> list[Any]:
    """The worker's parameters after each of ``steps`` SGD steps on fixed data."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    model, opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    gen = torch.Generator().manual_seed(1)
    seen = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen)
        loss = (model(x) - x[:, :4]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone())
    opt.finish()
    return seen


@pytest.mark.parametrize("push", ["int8", "topk", "sign", "threshold"])
def test_a_worker_keeps_what_its_push_filter_held_back(push: str) -> None:
    """One worker, one server: the filter delays what reaches the server, but the
    worker trains on its own model plus what it has not delivered yet, so its
    trajectory is the unfiltered one (up to float rounding of the sums)."""
    import torch

    plain = run_ranks(_trajectory, 2, strategy="asgd", args=(12,), roles=["worker", "server"])[0]
    params: dict[str, Any] = {"push_compression": push}
    if push == "topk":
        params["push_density"] = 0.1
    if push == "threshold":
        params["push_threshold"] = 0.05  # most steps hold a tensor back
    filtered = run_ranks(
        _trajectory, 2, strategy="asgd", params=params, args=(12,), roles=["worker", "server"]
    )[0]
    assert plain is not None and filtered is not None
    for step, (a, b) in enumerate(zip(plain, filtered, strict=True)):
        gap = float((a - b).abs().max())
        assert torch.allclose(a, b, atol=1e-5), f"{push}: step {step} differs by {gap}"
