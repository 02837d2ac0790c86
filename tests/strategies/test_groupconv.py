"""Group-convolution parallelism (``dmlctl/runtime/parallel/convs.py``) on real gloo
ranks against one process.

The example CNN (``examples/parallel/groupconv.py``) split over 2 tensor-parallel
ranks computes the whole network's outputs, and the gradients of its input and of
every parameter (each rank's slices gathered into the whole tensor) equal the whole
network's for the same batch; so for a model whose first layer is grouped and whose
output stays split by channels (the ``scatter`` and ``collect`` exchanges). Trained 6
Adam steps on a 2 × 2 mesh (tp × dp_replicate) through ``ctx.prepare`` and the job's
``parallelize`` function, it logs one process's losses.

``TOLERANCE`` = 1e-5, float32: for a tensor, max |split − whole| relative to max
|whole| (measured: at most 4.5e-7;
conv3's, conv4's and fc1's gradients bit-identical); for the losses (≈ 2.3),
the absolute gap (measured: at most 2.4e-7). A wrong exchange (a gradient summed
twice, a partial sum never reduced) is off by O(1).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from dmlctl.mesh import MeshLayout, dumps
from dmlctl.runtime.parallel.apply import load_function
from dmlctl.runtime.parallel.convs import plan_split, split_network
from tests.strategies.harness import run_ranks

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "parallel" / "groupconv.py"
TOLERANCE = 1e-5
STEPS = 6
BATCH = 8  # the global batch of the training test; each replica takes its share


def _network() -> nn.Sequential:
    """The example's CNN (seed 0), its file loaded as the runtime loads ``parallelize:``."""
    network: Callable[..., nn.Sequential] = load_function(f"{EXAMPLE}:network")
    return network(seed=0)


def _grouped() -> nn.Sequential:
    """A model that starts grouped (a ``scatter`` first) and ends split (``collect``)."""
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1, groups=2), nn.ReLU(), nn.Conv2d(4, 6, 1, groups=2)
    )


def _gaps(ctx: Any, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """:func:`_gap` (split, whole) of the output, the input's gradient and each parameter's
    gradient (by name; a DTensor's shards gathered), ``model`` split over
    ``ctx.mesh["tp"]`` against a copy of it whole, for the cross-entropy of ``x``, ``y``."""
    whole = copy.deepcopy(model)
    split = split_network(model, ctx.mesh["tp"])
    xs, xw = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_s, out_w = split(xs), whole(xw)
    torch.autograd.backward(F.cross_entropy(out_s, y))
    torch.autograd.backward(F.cross_entropy(out_w, y))
    wanted = dict(whole.named_parameters())
    gaps = {"output": _gap(out_s, out_w), "input": _gap(xs.grad, xw.grad)}
    for name, p in split.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        gaps[name] = _gap(grad, wanted.pop(name).grad)
    assert not wanted, f"parameters missing from the split model: {sorted(wanted)}"
    return gaps


def _gap(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """max |a − b| relative to max |b| (``b``: the whole network's)."""
    assert a is not None and b is not None
    return float((a.detach() - b.detach()).abs().max() / b.detach().abs().max())


def _compare(ctx: Any) -> dict[str, Any]:
    """:func:`_gaps` for the example CNN and for :func:`_grouped`, and the shapes this
    rank holds of the CNN's split weights."""
    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(4, 1, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen)
    x2, y2 = torch.randn(3, 2, 5, 5, generator=gen), torch.randint(0, 6, (3, 5, 5), generator=gen)
    cnn = split_network(_network(), ctx.mesh["tp"])
    held = {
        n: tuple((p.to_local() if isinstance(p, DTensor) else p).shape)
        for n, p in cnn.named_parameters()
        if n.endswith("weight")
    }
    return {
        "cnn": _gaps(ctx, _network(), x, y),
        "grouped": _gaps(ctx, _grouped(), x2, y2),
        "held": held,
    }


def test_the_split_network_computes_the_whole_one() -> None:
    env = {"DMLCTL_PARALLELISM": dumps(MeshLayout(tp=2))}
    out = run_ranks(_compare, 2, env=env, timeout=120)
    for rank, result in enumerate(out):
        for model in ("cnn", "grouped"):
            gaps = result[model]
            worst = max(gaps, key=gaps.__getitem__)
            assert gaps[worst] < TOLERANCE, (rank, model, worst, gaps)
        assert result["held"] == {  # half of every split layer; fc2 whole
            "conv1.weight": (8, 1, 3, 3),
            "conv2.weight": (16, 8, 3, 3),
            "conv3.weight": (16, 32, 3, 3),
            "conv4.weight": (16, 16, 3, 3),
            "fc1.weight": (64, 64),
            "fc2.weight": (10, 64),
        }


def test_the_plan_exchanges_only_where_every_channel_is_needed() -> None:
    plan = plan_split(_network(), 2)
    exchanges = [(name, action) for name, action in plan if action not in ("keep", "split")]
    assert exchanges == [("share_conv1", "share"), ("gather_conv3", "gather")]
    assert [n for n, a in plan if a == "split"] == ["conv1", "conv2", "conv3", "conv4", "fc1"]
    assert [a for _, a in plan_split(_grouped(), 2)] == [
        "scatter",
        "split",
        "keep",
        "split",
        "collect",
    ]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (nn.Sequential(nn.Conv2d(6, 6, 3, groups=3)), "groups=3, not divisible by"),
        (nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)), "BatchNorm2d"),
        (nn.Sequential(nn.Conv2d(1, 4, 1), nn.Flatten(), nn.Linear(3, 2)), "3 input features"),
        (nn.Conv2d(1, 4, 3), "nn.Sequential"),
    ],
    ids=["groups", "cross-channel", "rows", "not-sequential"],
)
def test_what_cannot_be_split_is_refused(model: nn.Module, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_split(model, 2)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 1, 8, 8, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)


def _train(ctx: Any, steps: int) -> list[float]:
    """``steps`` Adam steps on this replica's share of each global batch, the model laid
    out by ``ctx.prepare`` (``ctx`` None: in this process, whole, on the whole batch);
    the whole batch's loss after each (the mean over the replicas)."""
    model: nn.Module = _network()
    opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    replicas, replica = 1, 0
    if ctx is not None:
        model, opt = ctx.prepare(model, opt)
        replicas, replica = ctx.data_parallel_size, ctx.data_parallel_rank
    losses = []
    for step in range(steps):
        x, y = (t.chunk(replicas)[replica] for t in _batch(step))
        loss = F.cross_entropy(model(x), y)
        torch.autograd.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()) if ctx is None else ctx.all_reduce_mean(loss))
    return losses


@pytest.mark.parametrize(
    ("layout", "function"),
    [(MeshLayout(dp_replicate=2, tp=2), True), (MeshLayout(tp=2), False)],
    ids=["tp2-dp2-the-jobs-function", "tp2-dmlctls-default-plan"],
)
def test_training_matches_one_process(layout: MeshLayout, function: bool) -> None:
    """Through ``ctx.prepare``: with the example's ``parallelize`` function, and with
    none — dmlctl's default plan splits a sequential network with convolutions the
    same way."""
    reference = _train(None, STEPS)
    env = {"DMLCTL_PARALLELISM": dumps(layout)}
    if function:
        env["DMLCTL_PARALLELIZE"] = f"{EXAMPLE}:parallelize"
    out = run_ranks(_train, layout.world, args=(STEPS,), env=env, timeout=120)
    for rank, losses in enumerate(out):
        gap = max(abs(a - b) for a, b in zip(losses, reference, strict=True))
        assert gap < TOLERANCE, (rank, gap, losses, reference)
