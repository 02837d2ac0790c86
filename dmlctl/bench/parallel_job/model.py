# mypy: disable-error-code="no-any-return"
"""A small GPT-style transformer (3,302,912 parameters with the default ``Config``): the
model of ``examples/parallel`` and of ``dmlctl bench parallel``, written so dmlctl's
default plans split it: an ``nn.Sequential`` of blocks (pipeline stages cut between
children) whose linear layers carry the conventional names (``wq``/``wk``/``wv``/``wo``
in attention, ``w1``/``w2`` in the MLP: tensor parallelism splits them), and attention
that reshapes with ``-1`` heads (each tensor-parallel rank holds ``heads / tp``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Config:
    vocab: int = 256  # bytes
    context: int = 64
    dim: int = 256
    heads: int = 4
    layers: int = 4
    hidden: int = 1024


class Embed(nn.Module):
    """Token and position embeddings."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.dim)
        self.positions = nn.Embedding(cfg.context, cfg.dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tokens(idx) + self.positions(pos)


class Attention(nn.Module):
    """Causal self-attention; ``-1`` heads in the reshape, so a rank holding a slice
    of wq/wk/wv (tensor parallelism) computes its own heads."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.head_dim = cfg.dim // cfg.heads
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (
            w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.attention = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.feed_forward(self.norm2(x))


class Head(nn.Module):
    """Final norm and the projection to the vocabulary."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cfg.dim)
        self.out = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def transformer(cfg: Config | None = None) -> nn.Sequential:
    """The model: embeddings, ``cfg.layers`` blocks, the head, in one Sequential."""
    cfg = cfg or Config()
    blocks = [Block(cfg) for _ in range(cfg.layers)]
    model = nn.Sequential(Embed(cfg), *blocks, Head(cfg))
    for name, p in model.named_parameters():
        if p.dim() > 1:
            std = (
                0.02 / math.sqrt(2 * cfg.layers)
                if name.endswith(("wo.weight", "w2.weight"))
                else 0.02
            )
            nn.init.normal_(p, std=std)
    return model


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over every position."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
