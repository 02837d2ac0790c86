"""D-PSGD: topology unit tests, Params validation, and its defining properties on
real gloo ranks (mixing keeps the model mean, consensus shrinks, point-to-point
traffic only) plus convergence against the single-process baseline.

The multi-rank checks are batched: one 4-rank spawn checks the properties for every
topology (building the optimizer through ``dpsgd.prepare`` directly), one more runs
the convergence problem through ``ctx.prepare`` as a real job would.
"""

from __future__ import annotations

import subprocess
import sys
from itertools import pairwise
from typing import Any, get_args

import pytest
from pydantic import ValidationError

from dmlctl.spec.field_docs import field_docs
from dmlctl.strategies import registry, topology
from dmlctl.strategies.dpsgd import params as dpsgd
from dmlctl.strategies.dpsgd import strategy as dpsgd_strategy

# --------------------------------------------------------------------------- topology

NS = range(1, 10)


@pytest.mark.parametrize("name", topology.TOPOLOGIES)
@pytest.mark.parametrize("n", NS)
def test_mixing_matrix_is_symmetric_and_doubly_stochastic(name: str, n: int) -> None:
    w = topology.mixing_matrix(name, n)
    assert topology.is_doubly_stochastic(w)
    assert all(abs(w[i][j] - w[j][i]) < 1e-12 for i in range(n) for j in range(n))
    for i in range(n):
        row = topology.neighbours(name, n, i)
        assert i in row
        assert {j for j in range(n) if w[i][j] > 0} == set(row)
        assert all(row[j] == w[i][j] for j in row)


@pytest.mark.parametrize("name", topology.TOPOLOGIES)
@pytest.mark.parametrize("n", NS)
def test_repeated_mixing_reaches_the_mean(name: str, n: int) -> None:
    """Connected graph with positive self-weights: Wᵏx → mean(x)·1."""
    w = topology.mixing_matrix(name, n)
    x = [float(i * i) for i in range(n)]
    mean = sum(x) / n
    for _ in range(200):
        x = [sum(w[i][j] * x[j] for j in range(n)) for i in range(n)]
        assert abs(sum(x) / n - mean) < 1e-9
    assert max(abs(v - mean) for v in x) < 1e-6


@pytest.mark.parametrize("n", NS)
def test_ring_and_complete_weights(n: int) -> None:
    ring = (
        {0: 1.0} if n == 1 else {0: 0.5, 1: 0.5} if n == 2 else dict.fromkeys((0, 1, n - 1), 1 / 3)
    )
    assert topology.neighbours("ring", n, 0) == pytest.approx(ring)
    for row in topology.mixing_matrix("complete", n):  # complete: uniform 1/n
        assert row == pytest.approx([1 / n] * n)


def test_exponential_peers_at_powers_of_two() -> None:
    assert topology.peers("exponential", 1, 0) == []
    assert topology.peers("exponential", 2, 0) == [1]
    assert topology.peers("exponential", 6, 0) == [1, 2, 4, 5]
    assert topology.peers("exponential", 8, 3) == [1, 2, 4, 5, 7]  # 3±1, 3±2, 3±4
    assert topology.peers("exponential", 16, 0) == [1, 2, 4, 8, 12, 14, 15]
    # Uniform (Metropolis–Hastings on a regular graph): 1/(degree + 1) everywhere.
    assert list(topology.neighbours("exponential", 8, 0).values()) == pytest.approx([1 / 6] * 6)


def test_unknown_topology_and_bad_sizes() -> None:
    with pytest.raises(ValueError, match="ring, exponential, complete"):
        topology.mixing_matrix("torus", 4)
    with pytest.raises(ValueError, match="valid"):
        topology.neighbours("star", 4, 0)
    with pytest.raises(ValueError):
        topology.mixing_matrix("ring", 0)
    with pytest.raises(ValueError):
        topology.neighbours("ring", 4, 4)


def test_is_doubly_stochastic_rejects() -> None:
    assert not topology.is_doubly_stochastic([])
    assert not topology.is_doubly_stochastic([[1.0, 0.0]])
    assert not topology.is_doubly_stochastic([[0.5, 0.5], [1.0, 0.0]])  # columns
    assert not topology.is_doubly_stochastic([[1.5, -0.5], [-0.5, 1.5]])  # negative


# --------------------------------------------------------------------------- Params


def test_params_defaults_and_validation() -> None:
    p = dpsgd.Params()
    assert (p.topology, p.period, p.consensus_every) == ("ring", 1, 10)
    assert dpsgd.Params.model_validate({"topology": "exponential", "period": 4}).period == 4
    with pytest.raises(ValidationError, match="'ring', 'exponential' or 'complete'"):
        dpsgd.Params.model_validate({"topology": "torus"})
    for bad in ({"period": 0}, {"consensus_every": -1}, {"gossip": True}):
        with pytest.raises(ValidationError):
            dpsgd.Params.model_validate(bad)
    with pytest.raises(ValidationError):
        p.period = 2  # frozen
    assert get_args(dpsgd.Topology) == topology.TOPOLOGIES
    assert field_docs(dpsgd.Params).keys() == dpsgd.Params.model_fields.keys()


def test_registered_and_importable_without_torch() -> None:
    assert registry.load("dpsgd") is dpsgd
    code = (
        "import sys, dmlctl.strategies.dpsgd.params, dmlctl.strategies.topology;"
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_world_of_one_is_plain_local_training() -> None:
    import types

    import torch

    from tests.strategies import problem

    x, y = problem.data(256)
    nets = [problem.model(0), problem.model(0)]
    plain = torch.optim.SGD(nets[0].parameters(), lr=0.1)
    ctx = types.SimpleNamespace(rank=0, world_size=1)
    inner = torch.optim.SGD(nets[1].parameters(), lr=0.1)
    model, wrapped = dpsgd_strategy.prepare(ctx, nets[1], inner, dpsgd.Params())  # type: ignore[arg-type]
    assert model is nets[1]
    for _ in range(12):
        for net, opt in zip(nets, (plain, wrapped), strict=True):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert torch.equal(a, b)
    metrics = wrapped.metrics()  # type: ignore[attr-defined]
    assert metrics["comm_bytes_per_step"] == 0 and metrics["consensus"] == 0.0
    assert wrapped.state_dict()["strategy"]["local_steps"] == 12


# --------------------------------------------------------------------------- real ranks

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "gather",
    "scatter",
    "all_gather_object",
    "broadcast_object_list",
)


def _properties_on_rank(ctx: Any) -> dict[str, Any]:
    """Every topology on this rank: lr-0 mixing (mean, consensus) and traffic."""
    import torch
    import torch.distributed as dist
    from torch import nn

    def build(**params: Any) -> tuple[nn.Module, Any]:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
        inner = torch.optim.SGD(net.parameters(), lr=params.pop("lr", 0.0))
        return dpsgd_strategy.prepare(ctx, net, inner, dpsgd.Params(**params))

    def flat(net: nn.Module) -> list[float]:  # plain lists: tensors would travel back
        # through shared-memory file descriptors that die with this process.
        return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).tolist()

    out: dict[str, Any] = {"param_bytes": 0, "mixing": {}, "traffic": {}}
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    for name in topology.TOPOLOGIES:
        net, opt = build(topology=name, consensus_every=1)
        with torch.no_grad():  # different models per rank, identical start otherwise
            for p in net.parameters():
                p.add_(torch.randn(p.shape, generator=gen))
        history, consensus = [flat(net)], []
        for _ in range(8):
            opt.step()  # lr 0 and no gradient: the step is pure mixing
            history.append(flat(net))
            consensus.append(opt.meter.extra["consensus"])
        out["mixing"][name] = {"history": history, "consensus": consensus}
        out["param_bytes"] = len(history[0]) * 4  # float32

    x = torch.randn(32, 6, generator=gen)
    y = torch.randint(3, (32,), generator=gen)
    for name, period in (("ring", 1), ("ring", 2), ("exponential", 1)):
        net, opt = build(topology=name, period=period, consensus_every=0, lr=0.1)
        opt.metrics()  # start the window after the broadcast in prepare
        saved = {n: getattr(dist, n) for n in COLLECTIVES}

        def forbidden(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("global collective in the D-PSGD training path")

        try:
            for n in COLLECTIVES:
                setattr(dist, n, forbidden)
            for _ in range(6):
                opt.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
        finally:
            for n, fn in saved.items():
                setattr(dist, n, fn)
        out["traffic"][f"{name}/{period}"] = {"metrics": opt.metrics(), "peers": opt.peers}
    return out


# Convergence: 4 workers × 16 samples per step on a ring vs one process with 64.
STEPS, BATCH, WORKERS, LR, TOLERANCE = 200, 16, 4, 0.05, 0.02
JOB_PARAMS = {"topology": "ring", "consensus_every": 25}


def _on_rank(ctx: Any) -> dict[str, Any]:
    """The convergence run through ``ctx.prepare`` (the job's params), then the
    property checks: one spawn for everything."""
    from tests.strategies import problem

    trained = problem.train_on_rank(ctx, STEPS, BATCH, LR)
    trained["params"] = trained["params"].tolist()  # no shared-memory tensors back
    return {"train": trained, **_properties_on_rank(ctx)}


@pytest.fixture(scope="module")
def four_ranks() -> list[dict[str, Any]]:
    from tests.strategies.harness import run_ranks

    return run_ranks(_on_rank, WORKERS, strategy="dpsgd", params=JOB_PARAMS)


@pytest.mark.integration
@pytest.mark.parametrize("name", topology.TOPOLOGIES)
def test_mixing_preserves_the_mean(four_ranks: list[dict[str, Any]], name: str) -> None:
    import torch

    histories = [torch.tensor(r["mixing"][name]["history"]) for r in four_ranks]
    means = [torch.stack([h[k] for h in histories]).double().mean(0) for k in range(9)]
    spread = (torch.stack([h[0] for h in histories]).double() - means[0]).abs().max()
    assert spread > 0.5  # the ranks really started apart
    for mean in means[1:]:
        torch.testing.assert_close(mean, means[0], rtol=0, atol=1e-6)


@pytest.mark.integration
@pytest.mark.parametrize("name", topology.TOPOLOGIES)
def test_consensus_shrinks_monotonically(four_ranks: list[dict[str, Any]], name: str) -> None:
    import torch

    histories = [torch.tensor(r["mixing"][name]["history"]) for r in four_ranks]

    def distance(k: int) -> float:
        models = torch.stack([h[k] for h in histories]).double()
        return float(((models - models.mean(0)) ** 2).sum(1).mean().sqrt())

    exact = [distance(k) for k in range(9)]
    reported = four_ranks[0]["mixing"][name]["consensus"]
    assert reported == pytest.approx(exact[1:], abs=1e-5)
    assert all(r["mixing"][name]["consensus"] == reported for r in four_ranks)
    for before, after in pairwise(exact):
        assert after <= before + 1e-6  # float noise once it is ~0 (complete graph)
    if name == "ring":  # 4-cycle with weights 1/3: the spread shrinks 3× per round
        for before, after in pairwise(exact):
            assert after == pytest.approx(before / 3, rel=1e-3)
    assert exact[-1] < 1e-3 * exact[0]


@pytest.mark.integration
def test_only_point_to_point_traffic(four_ranks: list[dict[str, Any]]) -> None:
    param_bytes = four_ranks[0]["param_bytes"]
    for rank, result in enumerate(four_ranks):
        traffic = result["traffic"]
        assert traffic["ring/1"]["peers"] == sorted({(rank + 1) % 4, (rank - 1) % 4})
        assert traffic["exponential/1"]["peers"] == [j for j in range(4) if j != rank]
        per_step = {k: v["metrics"]["comm_bytes_per_step"] for k, v in traffic.items()}
        assert per_step == {
            "ring/1": 2 * param_bytes,
            "ring/2": 2 * param_bytes / 2,  # mixes every other step
            "exponential/1": 3 * param_bytes,
        }
        assert all(0 <= v["metrics"]["comm_share"] <= 1 for v in traffic.values())


@pytest.mark.integration
def test_converges_like_the_single_process_baseline(four_ranks: list[dict[str, Any]]) -> None:
    """Within TOLERANCE of the full-data loss of single-process SGD on the union batch
    (seen: |Δ| ≤ 0.002 at a loss of ≈ 0.54)."""
    from tests.strategies import problem

    base = problem.baseline(STEPS, BATCH * WORKERS, LR)
    start = problem.full_loss(problem.model(0), *problem.data())
    losses = [r["train"]["loss"] for r in four_ranks]
    assert base < 0.8 * start  # the baseline learned something
    assert all(abs(loss - base) < TOLERANCE for loss in losses), (losses, base)
    metrics = four_ranks[0]["train"]["metrics"]
    assert metrics["comm_bytes_per_step"] == 2 * len(four_ranks[0]["train"]["params"]) * 4
    assert 0 < metrics["consensus"] < 0.1
