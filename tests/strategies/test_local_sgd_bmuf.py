"""local-sgd and bmuf: defining properties on real gloo ranks, convergence, Params.

Rank functions return numpy arrays, never tensors: the harness's queue passes a tensor
as a shared-memory file descriptor, gone if the rank exits before the parent reads it.
"""

from __future__ import annotations

import io
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from dmlctl.runs.events import MetricRecord
from dmlctl.runs.reducer import apply
from dmlctl.runs.state import new_run_state
from dmlctl.strategies import registry
from dmlctl.strategies.bmuf import params as bmuf
from dmlctl.strategies.common import assign_flat
from dmlctl.strategies.local_sgd import params as local_sgd
from dmlctl.strategies.local_sgd import strategy as local_sgd_strategy
from tests.strategies import problem
from tests.strategies.harness import run_ranks

SHORT = (20, 16)  # steps, batch per worker: exact-equivalence runs
CONV = (150, 32)  # convergence runs (single-process baseline loss ≈ 0.64)
X, Y = problem.data()


def _flat(net: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy().copy()


def _step(net: torch.nn.Module, opt: torch.optim.Optimizer, idx: torch.Tensor) -> None:
    loss = F.cross_entropy(net(X[idx]), Y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()


# ------------------------------------------------------------------ rank functions
# Several runs share one process group: a strategy's prepare is called directly, so
# one harness call (≈ 3 s of process start-up) covers several strategies.


def _train(ctx: Any, strategy: str, params: dict[str, Any], steps: int, batch: int) -> Any:
    """tests.strategies.problem.train_on_rank's loop with the given strategy."""
    module = registry.load_runtime(strategy)
    settings = registry.load(strategy).Params(**params)
    net = problem.model(0)
    net, opt = module.prepare(ctx, net, torch.optim.SGD(net.parameters(), lr=0.05), settings)
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    for _ in range(steps):
        _step(net, opt, torch.randint(len(X), (batch,), generator=gen))
    inner = getattr(net, "module", net)
    metrics = opt.metrics() if hasattr(opt, "metrics") else {}
    return {"loss": problem.full_loss(inner, X, Y), "params": _flat(inner), "metrics": metrics}


def _records(ctx: Any, strategy: str, params: dict[str, Any]) -> list[dict[str, float]]:
    """16 steps of ``strategy``, one metric record every 2 steps: what ``ctx.log``
    merges in from the wrapped model's and optimizer's ``metrics()``."""
    module = registry.load_runtime(strategy)
    settings = registry.load(strategy).Params(**params)
    net = problem.model(0)
    net, opt = module.prepare(ctx, net, torch.optim.SGD(net.parameters(), lr=0.05), settings)
    sources = [w.metrics for w in (opt, net) if callable(getattr(w, "metrics", None))]
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    records = []
    for step in range(1, 17):
        _step(net, opt, torch.randint(len(X), (16,), generator=gen))
        if step % 2 == 0:
            records.append({k: v for source in sources for k, v in source().items()})
    return records


def _schedule(ctx: Any) -> dict[str, Any]:
    """Through ctx.prepare (local-sgd, period 8, warm-up 3): 11 steps, spying on every
    communicate(); then the other 2-rank training runs."""
    net = problem.model(ctx.rank)  # different on each rank: prepare must broadcast
    net, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05))
    start = _flat(net)
    pre: dict[int, np.ndarray] = {}
    communicate = opt.communicate

    def spy() -> None:
        pre[opt.local_steps] = _flat(net)
        communicate()

    opt.communicate = spy
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    after, windows = [], {}
    for step in range(1, 12):
        _step(net, opt, torch.randint(len(X), (16,), generator=gen))
        after.append(_flat(net))
        if step in (3, 11):
            windows[step] = opt.metrics()
    runs = {
        "ssgd": _train(ctx, "ssgd", {}, *SHORT),
        "lsgd1": _train(ctx, "local-sgd", {"period": 1}, *SHORT),
        "lsgd8": _train(ctx, "local-sgd", {"period": 8}, *CONV),
        "bmuf0": _train(ctx, "bmuf", {"period": 8, "block_momentum": 0.0}, *CONV),
        "records": {
            "ssgd": _records(ctx, "ssgd", {}),
            "lsgd4": _records(ctx, "local-sgd", {"period": 4, "warmup_steps": 0}),
        },
    }
    return {"start": start, "pre": pre, "after": after, "windows": windows, **runs}


def _hierarchical(ctx: Any) -> dict[str, Any]:
    """3 ranks posing as hosts of 2 and 1 workers: host rounds every 2 steps (a no-op
    on the 1-worker host), global rounds every 4."""
    single = local_sgd_strategy.host_subgroup(ctx)  # the harness's ranks share one host
    fake = SimpleNamespace(rank=ctx.rank, local_rank=(0, 1, 0)[ctx.rank], world_size=3)
    group, size = local_sgd_strategy.host_subgroup(fake)
    net = problem.model(0)
    opt = local_sgd_strategy.LocalSGDOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.05),
        list(net.parameters()),
        world_size=3,
        period=2,
        host_group=group,
        host_size=size,
        global_every=2,
    )
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    after, extra = [], []
    for _ in range(4):
        _step(net, opt, torch.randint(len(X), (16,), generator=gen))
        after.append(_flat(net))
        extra.append(dict(opt.meter.extra))
    return {"single": (single[0] is None, single[1]), "size": size, "after": after, "extra": extra}


def _bmuf_rule_and_state(ctx: Any) -> dict[str, Any]:
    """Through ctx.prepare (bmuf: η_b 0.5, ζ 0.8, Nesterov, τ 4): two hand-made
    blocks, then a checkpoint round trip; then the default-parameter training run."""
    net = problem.model(0)
    net, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9))
    w0 = _flat(net)
    rounds = []
    for _ in range(2):
        before = torch.from_numpy(_flat(net)) + (ctx.rank + 1)
        assign_flat(list(net.parameters()), before)
        opt.communicate()
        rounds.append(
            {
                "pre": before.numpy().copy(),
                "after": _flat(net),
                "w_g": opt.global_params.numpy().copy(),
                "delta": opt.delta.numpy().copy(),
                "consensus": opt.meter.extra["consensus"],
            }
        )
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    batches = [torch.randint(len(X), (16,), generator=gen) for _ in range(8)]
    for idx in batches[:6]:  # crosses the block boundary at local step 4
        _step(net, opt, idx)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    net2 = problem.model(7)
    net2, opt2 = ctx.prepare(net2, torch.optim.SGD(net2.parameters(), lr=0.05, momentum=0.9))
    assign_flat(list(net2.parameters()), torch.from_numpy(_flat(net)))
    opt2.load_state_dict(loaded)
    restored = {
        "w_g": bool(torch.equal(opt2.global_params, opt.global_params)),
        "delta": bool(torch.equal(opt2.delta, opt.delta)),
        "delta_nonzero": bool(opt.delta.abs().sum() > 0),
        "local_steps": (opt.local_steps, opt2.local_steps),
    }
    for idx in batches[6:]:  # both cross the boundary at local step 8
        _step(net, opt, idx)
        _step(net2, opt2, idx)
    return {
        "w0": w0,
        "rounds": rounds,
        "restored": restored,
        "a": _flat(net),
        "b": _flat(net2),
        "default": _train(ctx, "bmuf", {}, *CONV),
    }


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_ranks(_schedule, 2, strategy="local-sgd", params={"period": 8, "warmup_steps": 3})


@pytest.fixture(scope="module")
def bmuf_ranks() -> list[dict[str, Any]]:
    params = {"period": 4, "block_momentum": 0.5, "block_lr": 0.8, "nesterov": True}
    return run_ranks(_bmuf_rule_and_state, 2, strategy="bmuf", params=params)


def _same(a: np.ndarray, b: np.ndarray, atol: float = 1e-6) -> None:
    torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), atol=atol, rtol=0)


def test_period_one_model_averaging_equals_ssgd(two_ranks: list[dict[str, Any]]) -> None:
    for r in two_ranks:
        _same(r["lsgd1"]["params"], r["ssgd"]["params"])


def test_bmuf_without_block_momentum_equals_local_sgd(two_ranks: list[dict[str, Any]]) -> None:
    for r in two_ranks:
        # w_g + (mean − w_g) rounds differently from mean: tolerance, not equality.
        _same(r["bmuf0"]["params"], r["lsgd8"]["params"], atol=1e-5)


def test_averaging_makes_ranks_identical_and_reports_consensus(
    two_ranks: list[dict[str, Any]],
) -> None:
    r0, r1 = two_ranks
    np.testing.assert_array_equal(r0["start"], r1["start"])  # rank 0 broadcast
    for step in (1, 2, 3, 11):
        np.testing.assert_array_equal(r0["after"][step - 1], r1["after"][step - 1])
        mean = (r0["pre"][step] + r1["pre"][step]) / 2
        _same(r0["after"][step - 1], mean)
    mean = (r0["pre"][11] + r1["pre"][11]) / 2
    spread = np.sqrt(np.mean([np.sum((r["pre"][11] - mean) ** 2) for r in (r0, r1)]))
    param_bytes = r0["start"].size * 4  # what ssgd all-reduces every step (gradients)
    ssgd_bytes = r0["ssgd"]["metrics"].get("comm_bytes_per_step", param_bytes)
    assert ssgd_bytes == param_bytes
    for r in (r0, r1):
        assert r["windows"][11]["consensus"] == pytest.approx(spread, rel=1e-5)
        assert r["windows"][11]["consensus"] > 0
        # steps 4..11: one average of the parameters in 8 steps
        assert r["windows"][11]["comm_bytes_per_step"] <= ssgd_bytes / 8


def test_local_sgd_period_4_averages_a_quarter_of_ssgd_bytes(
    two_ranks: list[dict[str, Any]],
) -> None:
    """The dashboard's run average (the reducer over the ranks' records), not the last
    window: that one holds an averaging step in 2 steps, twice the run's share."""
    for r in two_ranks:
        average = {}
        for name, records in r["records"].items():
            events = [MetricRecord("h", 0, 2 * i, v, float(i)) for i, v in enumerate(records)]
            state = apply(new_run_state("r", "j", name, [(0, "h", "worker")], 0.0), events)
            totals = state.ranks[0].comm_run()
            assert totals is not None and totals.steps == 16
            average[name] = totals.bytes_per_step()
        assert average["ssgd"] == r["start"].size * 4  # every step: the gradients
        assert average["lsgd4"] == pytest.approx(average["ssgd"] / 4, rel=0.02)
        assert r["records"]["lsgd4"][-1]["comm_bytes_per_step"] == pytest.approx(
            average["ssgd"] / 2, rel=0.02
        )


def test_warmup_averages_every_step_then_every_period(two_ranks: list[dict[str, Any]]) -> None:
    r0, r1 = two_ranks
    assert sorted(r0["pre"]) == sorted(r1["pre"]) == [1, 2, 3, 11]
    for step in range(4, 11):  # local steps: replicas drift apart
        assert not np.array_equal(r0["after"][step - 1], r1["after"][step - 1])
    assert r0["windows"][3]["comm_bytes_per_step"] == r0["start"].size * 4


def test_hierarchical_averages_hosts_then_everyone() -> None:
    ranks = run_ranks(_hierarchical, 3, strategy="local-sgd", params={"hierarchical": True})
    assert [r["single"] for r in ranks] == [(True, 3)] * 3  # one host: no subgroup
    assert [r["size"] for r in ranks] == [2, 2, 1]
    first, second, _, fourth = (list(s) for s in zip(*(r["after"] for r in ranks), strict=True))
    assert not np.array_equal(first[0], first[1])
    np.testing.assert_array_equal(second[0], second[1])  # host of 2: averaged
    assert not np.array_equal(second[0], second[2])  # not yet with the other host
    assert all(np.array_equal(fourth[0], p) for p in fourth)  # global round
    assert "consensus_host" in ranks[0]["extra"][1] and "consensus" not in ranks[0]["extra"][1]
    assert "consensus_host" not in ranks[2]["extra"][1]  # 1-worker host: nothing sent
    assert ranks[0]["extra"][3]["consensus"] > 0


def test_bmuf_update_rule_and_state_round_trip(bmuf_ranks: list[dict[str, Any]]) -> None:
    ranks = bmuf_ranks
    w_g, delta = ranks[0]["w0"].astype(np.float64), np.zeros(ranks[0]["w0"].size)
    for k in range(2):
        pre = [r["rounds"][k]["pre"] for r in ranks]
        mean = (pre[0] + pre[1]) / 2
        delta = 0.5 * delta + 0.8 * (mean - w_g)
        w_g = w_g + delta
        for r in ranks:
            _same(r["rounds"][k]["w_g"], w_g.astype(np.float32), atol=1e-5)
            _same(r["rounds"][k]["delta"], delta.astype(np.float32), atol=1e-5)
            _same(r["rounds"][k]["after"], (w_g + 0.5 * delta).astype(np.float32), atol=1e-5)
            # offsets +1 / +2: every element is 0.5 from the mean
            assert r["rounds"][k]["consensus"] == pytest.approx(0.5 * np.sqrt(mean.size))
    for r in ranks:
        assert r["restored"] == {
            "w_g": True,
            "delta": True,
            "delta_nonzero": True,
            "local_steps": (6, 6),
        }
        np.testing.assert_array_equal(r["a"], r["b"])  # same training after restore
    np.testing.assert_array_equal(ranks[0]["a"], ranks[1]["a"])


def test_convergence_matches_single_process_baseline(
    two_ranks: list[dict[str, Any]], bmuf_ranks: list[dict[str, Any]]
) -> None:
    # Tolerance: final full-data loss ≤ 1.15 × baseline + 0.02, where the baseline is
    # single-process SGD with the same steps and per-worker batch (≈ 0.64 here).
    limit = problem.baseline(*CONV) * 1.15 + 0.02
    runs = {"local-sgd": [r["lsgd8"] for r in two_ranks]}
    runs["bmuf"] = [r["default"] for r in bmuf_ranks]  # η_b = 1 − 1/2
    for name, per_rank in runs.items():
        for r in per_rank:
            assert r["loss"] <= limit, (name, r["loss"], limit)
            assert r["metrics"]["consensus"] > 0


# -------------------------------------------------------------- Params (no ranks)


@pytest.mark.parametrize(
    ("module", "data", "message"),
    [
        (local_sgd, {"period": 0}, "period must be ≥ 1"),
        (bmuf, {"period": 0}, "period must be ≥ 1"),
        (local_sgd, {"perod": 4}, "Extra inputs are not permitted"),
        (bmuf, {"momentum": 0.5}, "Extra inputs are not permitted"),
        (bmuf, {"block_momentum": 1.0}, "block momentum must be < 1"),
        (bmuf, {"block_momentum": -0.1}, "block momentum must be ≥ 0"),
        (bmuf, {"block_momentum": float("nan")}, "finite number"),
        (bmuf, {"block_lr": 0}, "block_lr must be > 0"),
        (local_sgd, {"warmup_steps": -1}, "warmup_steps must be ≥ 0"),
        (local_sgd, {"hierarchy_factor": 0}, "hierarchy_factor must be ≥ 1"),
    ],
)
def test_invalid_params_are_rejected(module: Any, data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        module.Params.model_validate(data)


def test_defaults_and_registry() -> None:
    assert local_sgd.Params() == local_sgd.Params(
        period=8, warmup_steps=0, hierarchical=False, hierarchy_factor=4
    )
    assert bmuf.Params().block_momentum is None
    assert bmuf.resolve_block_momentum(None, 4, False) == 0.75  # 1 − 1/N
    assert bmuf.resolve_block_momentum(None, 4, True) == 0.0  # the momenta compound
    assert bmuf.resolve_block_momentum(0.5, 4, True) == 0.5  # given: kept
    assert registry.load("local-sgd") is local_sgd and registry.load("bmuf") is bmuf


def test_modules_import_without_torch() -> None:
    code = (
        "import sys\n"
        "import dmlctl.strategies.bmuf.params, dmlctl.strategies.local_sgd.params\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
