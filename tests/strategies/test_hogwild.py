"""hogwild: shared memory on real gloo ranks, sparse convergence, host checks, launch.

One harness call (:func:`_scenario`, ≈ 3 s of process start-up) covers the
shared-memory, concurrent-SGD, sparse-convergence and file-removal checks; the tests
below each assert one part of its result. Rank functions return numpy arrays, never
tensors (see tests/strategies/test_local_sgd_bmuf.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from dmlctl.runtime.data import shard_batches
from dmlctl.strategies.hogwild import params as hogwild
from dmlctl.strategies.hogwild import strategy as hogwild_strategy
from tests.conftest import REPO, Cli
from tests.strategies import problem
from tests.strategies.harness import run_ranks

pytestmark = pytest.mark.integration

DIM, ACTIVE = 2_000, 10  # sparse problem: 10 active binary features out of 2,000
N_TRAIN, N_TEST = 20_000, 5_000
BATCH, EPOCHS, LR = 16, 2, 0.5
TOLERANCE = 0.03  # |test accuracy, 2 hogwild ranks − single process|
STEPS = (40, 60)  # dense SGD steps of rank 0 and rank 1: unequal on purpose


def _flat(net: nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy().copy()


def sparse_data() -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    """Train and test sets: active-feature indices [n, 10] and 0/1 labels from a hidden
    weight vector plus noise (the same on every rank: fixed seed)."""
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(DIM, generator=gen)

    def samples(n: int) -> torch.utils.data.TensorDataset:
        active = torch.randint(DIM, (n, ACTIVE), generator=gen)
        score = hidden[active].sum(dim=1) + 0.5 * torch.randn(n, generator=gen)
        return torch.utils.data.TensorDataset(active, (score > 0).float())

    return samples(N_TRAIN), samples(N_TEST)


class SparseLogistic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.EmbeddingBag(DIM, 1, mode="sum", sparse=True)
        self.bias = nn.Parameter(torch.zeros(1))
        nn.init.zeros_(self.weights.weight)

    def forward(self, active: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.weights(active).squeeze(1) + self.bias
        return out


def fit_sparse(net: nn.Module, opt: torch.optim.Optimizer, batches: Any) -> None:
    for x, y in batches:
        loss = F.binary_cross_entropy_with_logits(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def accuracy_of(net: nn.Module, test_set: torch.utils.data.TensorDataset) -> float:
    x, y = test_set.tensors
    with torch.no_grad():
        return float(((net(x) > 0).float() == y).float().mean().item())


def single_process_accuracy() -> float:
    """Test accuracy of the sparse problem trained by one process on all samples (one
    intra-op thread, like the ranks: sparse ops with two threads run ~15x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_set, test_set = sparse_data()
        net = SparseLogistic()
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        batches = shard_batches(train_set, rank=0, world_size=1, batch_size=BATCH, epochs=EPOCHS)
        fit_sparse(net, opt, batches)
        return accuracy_of(net, test_set)
    finally:
        torch.set_num_threads(threads)


# ------------------------------------------------------------------ the rank function


def _scenario(ctx: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"path": str(hogwild_strategy.shm_path())}

    # Shared memory: ranks start different; rank 0's parameters win; writes are seen.
    torch.manual_seed(ctx.rank)
    net = nn.Linear(4, 3)
    out["initial"] = _flat(net)
    model, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    out["same_model"] = model is net
    out["after_prepare"] = _flat(net)
    out["file_after_prepare"] = Path(out["path"]).exists()
    ctx.barrier()
    if ctx.rank == 1:
        with torch.no_grad():
            net.weight[0, 0] = 123.0
            net.bias.fill_(-1.0)
    ctx.barrier()
    out["seen"] = (float(net.weight.detach()[0, 0]), net.bias.detach().numpy().copy())

    # Concurrent SGD, unequal step counts: one collective inside step() would hang.
    x, y = problem.data()
    mlp = problem.model(ctx.rank)
    model, opt = hogwild_strategy.prepare(
        ctx, mlp, torch.optim.SGD(mlp.parameters(), lr=0.05), hogwild.Params()
    )
    start_loss = problem.full_loss(mlp, x, y)
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    for _ in range(STEPS[ctx.rank]):
        idx = torch.randint(len(x), (16,), generator=gen)
        loss = F.cross_entropy(mlp(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    metrics = opt.metrics()  # type: ignore[attr-defined]
    ctx.barrier()
    out["dense"] = {
        "params": _flat(mlp),
        "start_loss": start_loss,
        "end_loss": problem.full_loss(mlp, x, y),
        "metrics": metrics,
        "local_steps": opt.local_steps,  # type: ignore[attr-defined]
    }

    # Sparse logistic regression: each rank its shard, SGD on shared sparse weights.
    train_set, test_set = sparse_data()
    sparse = SparseLogistic()
    model, opt = hogwild_strategy.prepare(
        ctx, sparse, torch.optim.SGD(sparse.parameters(), lr=LR), hogwild.Params()
    )
    out["sparse_shared"] = all(p.is_shared() for p in sparse.parameters())
    fit_sparse(sparse, opt, ctx.shard(train_set, batch_size=BATCH, epochs=EPOCHS))
    ctx.barrier()
    out["sparse_acc"] = accuracy_of(sparse, test_set)
    out["sparse_params"] = _flat(sparse)
    return out


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    shm = Path(hogwild_strategy.shm_path()).parent
    before = set(shm.glob("dmlctl-hogwild-*"))
    results = run_ranks(_scenario, 2, strategy="hogwild")
    for r in results:
        r["left_behind"] = set(shm.glob("dmlctl-hogwild-*")) - before
    return results


# ------------------------------------------------------------------ on real ranks


def test_parameters_are_one_shared_memory(two_ranks: list[dict[str, Any]]) -> None:
    r0, r1 = two_ranks
    assert r0["same_model"] and r1["same_model"]
    assert not np.array_equal(r0["initial"], r1["initial"])  # seeded differently
    np.testing.assert_array_equal(r0["after_prepare"], r0["initial"])  # rank 0's start
    np.testing.assert_array_equal(r1["after_prepare"], r0["initial"])
    for r in two_ranks:  # rank 1's write, read on both ranks
        weight, bias = r["seen"]
        assert weight == 123.0
        np.testing.assert_array_equal(bias, np.full(3, -1.0, dtype=np.float32))


def test_concurrent_sgd_ends_identical_without_communication(
    two_ranks: list[dict[str, Any]],
) -> None:
    """Ranks take 40 and 60 steps: a collective in step() would deadlock, so the
    identical end state can only come from the shared memory."""
    r0, r1 = (r["dense"] for r in two_ranks)
    assert (r0["local_steps"], r1["local_steps"]) == STEPS
    np.testing.assert_array_equal(r0["params"], r1["params"])
    assert r0["end_loss"] == r1["end_loss"] < r0["start_loss"]
    for d in (r0, r1):
        assert d["metrics"]["comm_bytes_per_step"] == 0.0


def test_sparse_accuracy_matches_single_process(two_ranks: list[dict[str, Any]]) -> None:
    """Sparse logistic regression (10 active features of 2,000), SGD lr 0.5, batch 16,
    2 epochs of 20,000 samples: 2 hogwild ranks (10,000 samples each per epoch) reach a
    test accuracy within TOLERANCE = 0.03 of one process seeing all 20,000."""
    baseline = single_process_accuracy()
    r0, r1 = two_ranks
    assert r0["sparse_shared"] and r1["sparse_shared"]
    np.testing.assert_array_equal(r0["sparse_params"], r1["sparse_params"])
    assert r0["sparse_acc"] == r1["sparse_acc"]
    print(f"test accuracy: single process {baseline:.4f}, 2 hogwild ranks {r0['sparse_acc']:.4f}")
    assert baseline > 0.8
    assert abs(r0["sparse_acc"] - baseline) <= TOLERANCE


def test_shared_file_is_removed(two_ranks: list[dict[str, Any]]) -> None:
    for r in two_ranks:
        assert Path(r["path"]).name.startswith("dmlctl-hogwild-127.0.0.1-")  # MASTER_ADDR/PORT
        assert not r["file_after_prepare"]  # unlinked once every rank had mapped it
        assert r["left_behind"] == set()
    assert not Path(two_ranks[0]["path"]).exists()


# ------------------------------------------------------------------ without processes


def test_check_hosts() -> None:
    message = hogwild.check_hosts(hogwild.Params(), 2)
    assert message is not None and "hogwild" in message and "2 hosts" in message
    assert hogwild.check_hosts(hogwild.Params(), 1) is None


def test_params_reject_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        hogwild.Params.model_validate({"lock": True})


def test_world_of_one_returns_both_unchanged() -> None:
    net = nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ctx = SimpleNamespace(world_size=1, local_world_size=1, rank=0)
    assert hogwild_strategy.prepare(ctx, net, opt, hogwild.Params()) == (net, opt)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ctx", "net", "match"),
    [
        (SimpleNamespace(world_size=4, local_world_size=2, rank=0), nn.Linear(2, 2), "one host"),
        (
            SimpleNamespace(world_size=2, local_world_size=2, rank=0),
            nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double()),
            "one dtype",
        ),
        (
            SimpleNamespace(world_size=2, local_world_size=2, rank=0),
            nn.Linear(2, 2, device="meta"),
            "on the CPU",
        ),
    ],
)
def test_prepare_refuses_before_any_collective(ctx: Any, net: nn.Module, match: str) -> None:
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match=match):
        hogwild_strategy.prepare(ctx, net, opt, hogwild.Params())


def test_full_shared_memory_is_refused_not_sigbus(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="MiB free"):
        hogwild_strategy._check_room(tmp_path, 1 << 62)


def test_shm_path_names_run_and_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DMLCTL_RUN_ID", "run 1/x")
    monkeypatch.setenv("DMLCTL_ATTEMPT", "2")
    assert hogwild_strategy.shm_path().name == "dmlctl-hogwild-run_1_x-a2"
    monkeypatch.delenv("DMLCTL_RUN_ID")
    monkeypatch.delenv("DMLCTL_ATTEMPT")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert hogwild_strategy.shm_path().name == "dmlctl-hogwild-10.0.0.1-29500"


def test_import_does_not_load_torch() -> None:
    code = (
        "import sys, dmlctl.strategies.hogwild.params\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# ------------------------------------------------------------------ end to end


def test_example_launches(cli: Cli, tmp_path: Path) -> None:
    """examples/hogwild's job through the real CLI, for 1 epoch instead of its 2 (one
    process: 0.88 after 1 epoch, 0.90 after 2); the shared memory is gone after."""
    shm = Path(hogwild_strategy.shm_path()).parent
    before = set(shm.glob("dmlctl-hogwild-*"))
    example = REPO / "examples" / "hogwild"
    job = (example / "job.yaml").read_text()
    assert 'args: ["--epochs", "2"]' in job
    (tmp_path / "job.yaml").write_text(
        job.replace('args: ["--epochs", "2"]', 'args: ["--epochs", "1"]').replace(
            'workdir: "."', f"workdir: {example}"
        )
    )
    proc = cli.run("launch", str(tmp_path / "job.yaml"), "--ui", "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "final accuracy: " in proc.stdout
    accuracy = float(proc.stdout.split("final accuracy: ")[1].split()[0])
    assert accuracy >= 0.85, proc.stdout
    assert set(shm.glob("dmlctl-hogwild-*")) == before
