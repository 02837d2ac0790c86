"""cyclades on real gloo ranks sharing memory: the result equals a serial run of the
same planned updates bit for bit (serializability), the plan of the real data never
splits a component, a sparse logistic regression reaches the single-process
accuracy, and what breaks serializability (a dense parameter, momentum) is refused.
Rank functions return numpy arrays, never tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import BaseModel
from torch import nn

from dmlctl.runtime.data import shard_batches
from dmlctl.strategies.cyclades import params as cyclades
from dmlctl.strategies.cyclades.plan import components, plan_round
from dmlctl.strategies.cyclades.strategy import sample_coordinates
from tests.conftest import REPO, Cli
from tests.strategies.harness import run_ranks

pytestmark = pytest.mark.integration

DIM, ACTIVE = 2_000, 10
N_TRAIN, N_TEST = 20_000, 5_000
LR, BATCH, EPOCHS = 0.5, 4, 2
SAMPLE = 50  # updates per round (the derived default would be 2000 / 200 = 10)
TOLERANCE = 0.03  # |test accuracy, 2 cyclades ranks − single process|


def sparse_data(n_train: int = N_TRAIN) -> tuple[Any, Any]:
    """Active-feature indices [n, 10] and 0/1 labels from a hidden weight vector plus
    noise (the same on every rank: fixed seed)."""
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(DIM, generator=gen)

    def samples(n: int) -> torch.utils.data.TensorDataset:
        active = torch.randint(DIM, (n, ACTIVE), generator=gen)
        score = hidden[active].sum(dim=1) + 0.5 * torch.randn(n, generator=gen)
        return torch.utils.data.TensorDataset(active, (score > 0).float())

    return samples(n_train), samples(N_TEST)


class SparseLogistic(nn.Module):
    """Logistic regression on sparse binary features, no bias (a dense bias would
    conflict with every update)."""

    def __init__(self, bias: bool = False) -> None:
        super().__init__()
        self.weights = nn.EmbeddingBag(DIM, 1, mode="sum", sparse=True)
        nn.init.zeros_(self.weights.weight)
        self.bias = nn.Parameter(torch.zeros(1)) if bias else None

    def forward(self, active: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.weights(active).squeeze(1)
        return out + self.bias if self.bias is not None else out


def sgd_step(net: nn.Module, opt: torch.optim.Optimizer, x: Any, y: Any) -> None:
    loss = F.binary_cross_entropy_with_logits(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def accuracy_of(net: nn.Module, test_set: Any) -> float:
    x, y = test_set.tensors
    with torch.no_grad():
        return float(((net(x) > 0).float() == y).float().mean().item())


def _train(ctx: Any, n_train: int, epochs: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    train_set, test_set = sparse_data(n_train)
    net = SparseLogistic()
    model, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=LR))
    steps = 0
    for x, y in ctx.shard(train_set, batch_size=BATCH, epochs=epochs):
        sgd_step(model, opt, x, y)
        steps += 1
    return {
        "weights": net.weights.weight.detach().numpy().copy(),
        "acc": accuracy_of(net, test_set),
        "steps": steps,
        "metrics": opt.metrics(),
    }


def serial_replay(n_train: int, epochs: int, workers: int) -> tuple[np.ndarray, int]:
    """One process applying every round's planned batches, worker 0's first, then
    worker 1's …: what the concurrent run must equal exactly. Also the steps taken."""
    torch.set_num_threads(1)
    train_set, _ = sparse_data(n_train)
    net = SparseLogistic()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    active, labels = train_set.tensors
    steps = 0
    for epoch in range(epochs):
        order = torch.randperm(n_train, generator=torch.Generator().manual_seed(epoch)).tolist()
        for begin in range(0, n_train, SAMPLE):
            chosen = order[begin : begin + SAMPLE]
            plan = plan_round([active[i].tolist() for i in chosen], workers)
            for lists in plan:
                mine = [chosen[j] for part in lists for j in part]
                for k in range(0, len(mine), BATCH):
                    idx = torch.tensor(mine[k : k + BATCH])
                    sgd_step(net, opt, active[idx], labels[idx])
                    steps += 1
    return net.weights.weight.detach().numpy().copy(), steps


@pytest.fixture(scope="module")
def small_run() -> list[dict[str, Any]]:
    return run_ranks(
        _train, 2, strategy="cyclades", params={"sample_size": SAMPLE}, args=(4_000, 2)
    )


def test_concurrent_rounds_equal_the_serial_run_exactly(small_run: list[dict[str, Any]]) -> None:
    expected, steps = serial_replay(4_000, 2, workers=2)
    for rank in small_run:
        assert np.array_equal(rank["weights"], expected)  # bit for bit, on both ranks
    assert small_run[0]["steps"] + small_run[1]["steps"] == steps  # the same updates
    metrics = small_run[0]["metrics"]
    assert metrics["rounds"] == 2 * 4_000 / SAMPLE
    assert metrics["comm_bytes_per_step"] == 0
    assert 1 < metrics["components"] <= SAMPLE


def test_the_plan_of_the_real_data_never_splits_a_component() -> None:
    train_set, _ = sparse_data(4_000)
    order = torch.randperm(4_000, generator=torch.Generator().manual_seed(0)).tolist()
    for begin in range(0, 4_000, SAMPLE):
        chosen = order[begin : begin + SAMPLE]
        coords = [sample_coordinates(train_set[i], 0) for i in chosen]
        parts = components(coords)
        plan = plan_round(coords, 2)
        assert sorted(p for lists in plan for p in lists) == sorted(parts)
        mine = [{c for p in lists for i in p for c in coords[i]} for lists in plan]
        assert not mine[0] & mine[1]


def single_process_accuracy() -> float:
    torch.set_num_threads(1)
    train_set, test_set = sparse_data()
    net = SparseLogistic()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for x, y in shard_batches(train_set, rank=0, world_size=1, batch_size=BATCH, epochs=EPOCHS):
        sgd_step(net, opt, x, y)
    return accuracy_of(net, test_set)


def test_sparse_logistic_regression_reaches_the_single_process_accuracy() -> None:
    ranks = run_ranks(_train, 2, strategy="cyclades", args=(N_TRAIN, EPOCHS), timeout=300)
    baseline = single_process_accuracy()
    for rank in ranks:
        assert abs(rank["acc"] - baseline) <= TOLERANCE, (rank["acc"], baseline)
    assert ranks[0]["acc"] == ranks[1]["acc"]  # one shared model


def _refused(ctx: Any, what: str) -> None:
    net = SparseLogistic(bias=what == "bias")
    momentum = 0.9 if what == "momentum" else 0.0
    model, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=LR, momentum=momentum))
    train_set, _ = sparse_data(400)
    for x, y in ctx.shard(train_set, batch_size=BATCH):
        sgd_step(model, opt, x, y)


@pytest.mark.parametrize(
    ("what", "message"),
    [("bias", "parameter 'bias' has a dense gradient"), ("momentum", "SGD with momentum=0.9")],
)
def test_what_breaks_serializability_is_refused(what: str, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        run_ranks(_refused, 2, strategy="cyclades", args=(what,), timeout=60)


def test_one_host_only() -> None:
    assert cyclades.check_hosts(cyclades.Params(), 1) is None
    message = cyclades.check_hosts(cyclades.Params(), 2)
    assert message is not None and "one host" in message and "2 hosts" in message


def test_params_are_validated() -> None:
    assert cyclades.Params().sample_size is None and cyclades.Params().coordinates == 0
    for bad in ({"sample_size": 0}, {"coordinates": -1}, {"nope": 1}):
        with pytest.raises(ValueError):
            cyclades.Params.model_validate(bad)
    assert isinstance(cyclades.Params(), BaseModel)


def test_example_launches_and_matches_one_process(cli: Cli, tmp_path: Path) -> None:
    """examples/cyclades through the real CLI (1 epoch of 16-sample steps at lr 2, a
    quarter of the default's steps): the workers' shared model scores what one process
    applying the same kind of updates scores (one process: 0.8997)."""
    example = REPO / "examples" / "cyclades"
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: cyclades-example\nworkdir: {example}\nscript: train.py\n"
        'args: ["--epochs", "1", "--batch-size", "16", "--lr", "2"]\n'
        "workers: 2\nstrategy: cyclades\n"
    )
    proc = cli.run("launch", str(job), "--ui", "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    accuracy = float(proc.stdout.split("final accuracy: ")[1].split()[0])
    assert accuracy >= 0.88, proc.stdout
    metrics = (cli.runs()[0] / "metrics.jsonl").read_text()
    assert '"largest_share"' in metrics and '"rounds"' in metrics
