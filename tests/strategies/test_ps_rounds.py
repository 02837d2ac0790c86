"""Strategies whose servers apply updates in rounds, on real gloo ranks: ``sync-ps``
(backup workers) against ``ssgd``, its dropped late gradients; ``aadmm`` against
synchronous ``admm``, its delay bound under a straggler (from the server's own
counters), and its convergence to the least-squares solution.
"""

from __future__ import annotations

import io
import time
from typing import Any

import pytest

from tests.strategies.harness import run_ranks
from tests.strategies.test_ps_strategies import _train, ctx_state

pytestmark = pytest.mark.integration

W2S1 = ["worker", "worker", "server"]
W3S1 = ["worker", "worker", "worker", "server"]


def _server_state(ctx: Any) -> dict[str, Any]:
    import torch

    state = torch.load(io.BytesIO(ctx_state(ctx)), weights_only=True)
    assert isinstance(state, dict)
    return state


# ----------------------------------------------------------------- sync-ps


def test_sync_ps_without_backup_workers_matches_ssgd() -> None:
    import torch

    sync = run_ranks(_train, 2, strategy="ssgd")
    ps = run_ranks(_train, 3, strategy="sync-ps", roles=W2S1)
    assert ps[2] is None
    for a, b in zip(sync[0]["params"], ps[0]["params"], strict=True):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    for a, b in zip(ps[0]["params"], ps[1]["params"], strict=True):
        assert torch.equal(a, b)


def _scheduled(ctx: Any) -> list[Any]:
    """SGD + momentum with the learning rate halved every 4 steps (a scheduler on
    the worker's optimizer); the final parameters."""
    import torch

    from tests.strategies.test_ps_strategies import _data

    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    model, opt = ctx.prepare(model, opt)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    for x, y in ctx.shard(_data(), batch_size=8, shuffle=False):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    return [p.detach().clone() for p in model.parameters()]


def test_sync_ps_servers_follow_the_workers_lr_schedule() -> None:
    import torch

    sync = run_ranks(_scheduled, 2, strategy="ssgd")
    ps = run_ranks(_scheduled, 3, strategy="sync-ps", roles=W2S1)
    for a, b in zip(sync[0], ps[0], strict=True):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def _paced_sync(ctx: Any, steps: int, slow: float) -> dict[str, Any]:
    """``steps`` steps; the last worker sleeps ``slow`` s per step, the others 0.01.
    Returns (first worker) the server's state."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = ctx.prepare(model, opt)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    pause = slow if ctx.rank == ctx.world_size - 1 else 0.01
    for _ in range(steps):
        time.sleep(pause)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    opt.finish()
    return {"server": _server_state(ctx)} if ctx.rank == 0 else {}


def test_sync_ps_drops_the_late_gradients_of_a_slow_worker() -> None:
    """Three workers, one 3× slower, one backup worker: rounds close on the two fast
    workers' gradients and the slow worker's arrive late and are dropped, as the
    server counts them."""
    out = run_ranks(
        _paced_sync,
        4,
        strategy="sync-ps",
        params={"backup_workers": 1},
        roles=W3S1,
        args=(30, 0.03),
    )
    rule = out[0]["server"]["rule"]
    by = rule["dropped_by"]
    assert rule["dropped"] == sum(by.values())
    fast = by.get(0, 0) + by.get(1, 0)
    # While the fast workers train (≈ 12 of the slow one's 30 steps), nearly every
    # gradient of the slow worker is late; afterwards it trains alone and counts.
    assert by.get(2, 0) >= 8 and by[2] > 2 * fast, by
    assert rule["rounds"] >= 30  # the fast workers' 30 steps each made the rounds


# ----------------------------------------------------------------- aadmm


def _admm_rounds(ctx: Any, steps: int, local_steps: int) -> dict[str, Any]:
    """Train the shared small classifier; record z after every round."""
    import torch

    from tests.strategies.test_ps_strategies import _data

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = ctx.prepare(model, opt)
    zs = []
    batches = ctx.shard(_data(), batch_size=8, epochs=4, shuffle=False)
    for i, (x, y) in enumerate(batches):
        if i == steps:
            break
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (i + 1) % local_steps == 0:
            z = (
                opt.z
                if isinstance(opt.z, torch.Tensor)
                else torch.cat([t.reshape(-1) for t in opt.z])
            )
            zs.append(z.clone())
    return {"zs": zs}


def test_aadmm_with_a_full_barrier_follows_synchronous_admm() -> None:
    import torch

    k = 4
    sync = run_ranks(
        _admm_rounds,
        2,
        strategy="admm",
        params={"init": "broadcast", "local_steps": k},
        args=(32, k),
    )
    asyn = run_ranks(
        _admm_rounds,
        3,
        strategy="aadmm",
        params={"min_workers": 2, "max_delay": 1, "local_steps": k},
        roles=W2S1,
        args=(32, k),
    )
    assert len(sync[0]["zs"]) == len(asyn[0]["zs"]) == 8
    for rank in (0, 1):
        for a, b in zip(sync[rank]["zs"], asyn[rank]["zs"], strict=True):
            assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def _paced_admm(ctx: Any, steps: int) -> dict[str, Any]:
    """The last worker pauses 6× as long each step (so that it stays the slowest by
    far when a loaded machine slows every step alike); returns this worker's steps/s
    and (first worker) the server's state."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = ctx.prepare(model, opt)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    pause = 0.06 if ctx.rank == ctx.world_size - 1 else 0.01
    start = time.perf_counter()
    for _ in range(steps):
        time.sleep(pause)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    out: dict[str, Any] = {"rate": steps / (time.perf_counter() - start)}
    if ctx.rank == 0:
        out["server"] = _server_state(ctx)
    opt.finish()
    return out


@pytest.mark.parametrize("tau", [1, 3])
def test_aadmm_bounds_every_delay_and_lets_fast_workers_go_on(tau: int) -> None:
    """K₀ = 2 of 3 workers, the third much slower: z updates on the fast workers'
    reports, the slow worker misses updates — never more than τ, by the server's
    counters — and the fast workers take steps faster than the slow one."""
    out = run_ranks(
        _paced_admm,
        4,
        strategy="aadmm",
        params={"min_workers": 2, "max_delay": tau, "local_steps": 2},
        roles=W3S1,
        args=(40,),
    )
    rule = out[0]["server"]["rule"]
    assert 1 <= rule["worst_delay"] <= tau, rule["delay_histogram"]
    assert max(rule["delay_histogram"]) == rule["worst_delay"]
    fast = min(w["rate"] for w in out[:2])
    assert fast > 1.3 * out[2]["rate"], [w["rate"] for w in out[:3]]


def _least_squares(ctx: Any, rounds: int) -> dict[str, Any]:
    """Each worker owns a third of a least-squares problem (full-batch gradient
    steps on its rows); returns the final z and the lstsq solution of all rows."""
    import torch

    gen = torch.Generator().manual_seed(3)
    a = torch.randn(300, 5, generator=gen, dtype=torch.float64)
    b = a @ torch.randn(5, 1, generator=gen, dtype=torch.float64) + 0.1 * torch.randn(
        300, 1, generator=gen, dtype=torch.float64
    )
    rows = slice(100 * ctx.rank, 100 * (ctx.rank + 1))
    model = torch.nn.Linear(5, 1, bias=False).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ctx.prepare(model, opt)
    for _ in range(rounds * 10):
        loss = 0.5 * (model(a[rows]) - b[rows]).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    opt.finish()
    return {
        "w": model.weight.detach().reshape(-1).clone(),
        "lstsq": torch.linalg.lstsq(a, b).solution.reshape(-1),
    }


def test_aadmm_converges_to_the_least_squares_solution() -> None:
    import torch

    params = {"min_workers": 1, "max_delay": 2}  # asynchronous: one report makes an update
    out = run_ranks(_least_squares, 4, strategy="aadmm", params=params, roles=W3S1, args=(60,))
    for worker in out[:3]:
        gap = torch.linalg.vector_norm(worker["w"] - worker["lstsq"]) / torch.linalg.vector_norm(
            worker["lstsq"]
        )
        assert gap < 1e-2, (gap, worker["w"], worker["lstsq"])
