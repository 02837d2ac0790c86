"""The small learnable problem every strategy's convergence test trains on.

The quickstart's task (examples/quickstart): 4 classes, each a mixture of Gaussian
blobs in 8 dimensions, and a small MLP. Data comes from a fixed seed, so every rank
and the single-process baseline see the same samples.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CLASSES, BLOBS, DIM = 4, 3, 8


def data(n: int = 4096, seed: int = 42) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    centers = 0.8 * torch.randn(CLASSES * BLOBS, DIM, generator=gen)
    blob = torch.randint(CLASSES * BLOBS, (n,), generator=gen)
    x = centers[blob] + 0.5 * torch.randn(n, DIM, generator=gen)
    return x, blob % CLASSES


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def full_loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(F.cross_entropy(net(x), y).item())


def baseline(steps: int, batch: int, lr: float = 0.05, seed: int = 0) -> float:
    """Final full-data loss of single-process SGD with ``batch`` samples per step."""
    x, y = data()
    net = model(seed)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(len(x), (batch,), generator=gen)
        loss = F.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return full_loss(net, x, y)


def train_on_rank(ctx: Any, steps: int, batch: int, lr: float = 0.05) -> dict[str, Any]:
    """Run on every rank (through tests.strategies.harness): ``steps`` steps of
    ``batch`` samples per worker with the job's strategy; returns this rank's final
    full-data loss, its flat parameters and the metrics the strategy reported."""
    x, y = data()
    net = model(0)
    net, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=lr))
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    for _ in range(steps):
        idx = torch.randint(len(x), (batch,), generator=gen)
        loss = F.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    metrics = {}
    for source in ctx._log.sources:  # what ctx.log would merge into a record
        metrics.update(source())
    module = getattr(net, "module", net)
    return {
        "loss": full_loss(module, x, y),
        "params": torch.cat([p.detach().reshape(-1) for p in module.parameters()]),
        "metrics": metrics,
    }
