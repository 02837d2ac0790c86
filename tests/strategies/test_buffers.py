"""Buffers under every strategy (:mod:`dmlctl.runtime.buffers`): a model with an additive
causal mask of ``-inf`` (as ``nn.Transformer.generate_square_subsequent_mask`` makes
it), an integer table and a BatchNorm layer trains on each strategy's defaults with
Adam on 2 workers (real gloo ranks of the warm pool):

* no strategy reports a divergence (``-inf - -inf`` is NaN: a constant must never be
  averaged, differenced or judged);
* the mask and the table end bit-identical to what they were, on every rank;
* BatchNorm's running statistics moved, and end equal on every worker where the
  strategy promises one final model (they were exchanged: each worker saw other data);
* the strategy exchanged exactly the BatchNorm statistics.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dmlctl.runtime.buffers import ExchangedBuffers
from tests.strategies.harness import run_ranks

pytestmark = pytest.mark.integration

W2S1 = ["worker", "worker", "server"]
COLLECTIVE = ["ssgd", "local-sgd", "bmuf", "easgd", "admm", "dpsgd", "ensemble", "hogwild"]
SERVERS = ["asgd", "ssp", "adadelay", "easgd-async", "sync-ps", "aadmm"]
ONE_FINAL_MODEL = set(COLLECTIVE + SERVERS) - {"hogwild"}
"""Hogwild shares the parameters in memory; each worker's BatchNorm stays its own."""
BN_STATS = ["norm.running_mean", "norm.running_var"]
NO_RULE = {"ssgd", "hogwild"}
"""ssgd's DDP broadcasts rank 0's buffers (no arithmetic); hogwild exchanges nothing."""
SEQ = 6


class MaskedNet(nn.Module):
    """Causal attention over SEQ positions (mask buffer of -inf), a sinusoidal position
    table (a finite constant), BatchNorm, and an integer class table."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(1, 8)
        self.norm = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 2)
        mask = torch.triu(torch.full((SEQ, SEQ), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)
        position = torch.arange(SEQ, dtype=torch.float32).unsqueeze(1)
        self.register_buffer("sinusoid", torch.sin(position / 10 ** torch.arange(8) * 1.0))
        self.register_buffer("classes", torch.tensor([1, 0], dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.unsqueeze(-1)) + self.sinusoid  # (B, SEQ, 8)
        scores = h @ h.transpose(1, 2) / 8**0.5 + self.mask
        h = torch.softmax(scores, dim=-1) @ h
        h = self.norm(h[:, -1])
        logits: torch.Tensor = self.out(torch.relu(h))
        return logits[:, self.classes]


def _digest(tensors: list[torch.Tensor]) -> str:
    data = b"".join(
        t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors
    )
    return hashlib.sha256(data).hexdigest()[:16]


def _train(ctx: Any) -> dict[str, Any]:
    """Two epochs of 384 sequences (label: is the last value above the mean?)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(384, SEQ, generator=gen)
    y = (x[:, -1] > x.mean(dim=1)).long()
    net = MaskedNet()
    start = {name: b.clone() for name, b in net.named_buffers()}
    net, opt = ctx.prepare(net, torch.optim.Adam(net.parameters(), lr=3e-3))
    model = getattr(net, "module", net)  # ssgd wraps the model in DDP
    for xb, yb in ctx.shard(torch.utils.data.TensorDataset(x, y), batch_size=16, epochs=2):
        loss = F.cross_entropy(net(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss)
    buffers = dict(model.named_buffers())
    rule = getattr(opt, "buffers", None)
    names = {id(b): n for n, b in buffers.items()}
    return {
        "constants": [
            n for n in ("mask", "sinusoid", "classes") if torch.equal(buffers[n], start[n])
        ],
        "bn_moved": not torch.equal(buffers["norm.running_mean"], start["norm.running_mean"]),
        "bn": _digest([buffers[n] for n in BN_STATS]),
        "params": _digest(list(model.parameters())),
        "exchanged": None
        if not isinstance(rule, ExchangedBuffers) or not rule.resolved
        else sorted(names[id(b)] for b in rule.resolve()),
    }


def _check(strategy: str, ranks: list[dict[str, Any] | None]) -> None:
    workers = [r for r in ranks if r is not None]
    assert len(workers) == 2
    for w in workers:
        assert w["constants"] == ["mask", "sinusoid", "classes"], (strategy, w)
        assert w["bn_moved"], (strategy, w)
        assert w["exchanged"] == (None if strategy in NO_RULE else BN_STATS), (strategy, w)
    if strategy in ONE_FINAL_MODEL:
        assert workers[0]["params"] == workers[1]["params"], strategy
        assert workers[0]["bn"] == workers[1]["bn"], (strategy, "BatchNorm not exchanged")


@pytest.mark.parametrize("strategy", COLLECTIVE)
def test_collective_strategies_keep_constant_buffers_and_exchange_batchnorm(strategy: str) -> None:
    _check(strategy, run_ranks(_train, 2, strategy=strategy))


@pytest.mark.parametrize("strategy", SERVERS)
def test_parameter_server_strategies_keep_constant_buffers_and_exchange_batchnorm(
    strategy: str,
) -> None:
    _check(strategy, run_ranks(_train, 3, strategy=strategy, roles=W2S1))
