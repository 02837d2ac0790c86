"""Model, data and schedule shared by the strategy benchmark's two training scripts.

``mlp`` (throughput): 256 → 512 → 512 → 10 with ReLU. ``matrices`` (bytes): two
Linear(512, 512) layers, i.e. large matrices that PowerSGD compresses. The data is
synthetic, from a fixed seed, one epoch of exactly ``steps`` batches per rank.
"""

import argparse

import torch
from torch import nn

DIM, CLASSES = 256, 10


def parse_args() -> argparse.Namespace:
    """``--model``, ``--steps``, ``--warmup`` (untimed steps) and ``--batch-size`` (per rank)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("mlp", "matrices"), default="mlp")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=64)
    return parser.parse_args()


def build_model(kind: str) -> nn.Module:
    """The benchmark model, with the same initial parameters on every rank."""
    torch.manual_seed(0)
    if kind == "matrices":
        return nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512))
    return nn.Sequential(
        nn.Linear(DIM, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, CLASSES)
    )


def dataset(kind: str, steps: int, batch: int, world: int) -> torch.utils.data.TensorDataset:
    """Exactly ``steps`` batches of ``batch`` samples per rank."""
    gen = torch.Generator().manual_seed(42)
    n = steps * batch * world
    dim = 512 if kind == "matrices" else DIM
    x = torch.randn(n, dim, generator=gen)
    y = torch.randint(CLASSES, (n,), generator=gen)
    return torch.utils.data.TensorDataset(x, y)


def loss_of(kind: str, out: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for ``mlp``; reconstruction error for ``matrices``."""
    if kind == "matrices":
        return (out - x).pow(2).mean()
    return nn.functional.cross_entropy(out, y)
