"""EASGD and consensus ADMM: their defining properties on real gloo ranks, their
parameter checks on the control plane, and convergence on the shared problem.

Each strategy gets one spawn (a module-scoped fixture, ~3-10 s): every check that
needs ranks runs inside it and returns numbers; the tests assert on those.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from dmlctl.errors import UsageError
from dmlctl.plan.build import build_plan
from dmlctl.spec.cluster import ClusterSpec
from dmlctl.spec.models import JobSpec
from dmlctl.strategies.admm import params as admm
from dmlctl.strategies.admm import strategy as admm_strategy
from dmlctl.strategies.common import assign_flat, flat_params
from dmlctl.strategies.easgd import params as easgd
from dmlctl.strategies.easgd import strategy as easgd_strategy
from tests.conftest import Cli
from tests.strategies import problem
from tests.strategies.harness import run_ranks

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "strategies"

# Convergence: 600 steps of 32 samples per worker, SGD lr 0.05, on problem.py.
STEPS, BATCH, LR = 600, 32, 0.05
# Synchronous EASGD's center and workers move together at p/(p+1) of the plain SGD
# rate (the center adds inertia: drift v solves v = -ηg - (α/β)v), so 2 workers after
# N steps match the baseline after 2N/3 steps: tolerance 5% of that loss, and at most
# 0.1 above the baseline after N steps (measured: 0.338 vs 0.338 and 0.257).
EASGD_REL_TOL, EASGD_ABS_TOL = 1.05, 0.10
# ADMM's penalty ρ(x - z + u) slows each worker's own descent a little: at most 0.06
# above the baseline after the same N steps (measured: 0.299 vs 0.257).
ADMM_ABS_TOL = 0.06


def _baseline(steps: int) -> float:
    """problem.baseline on one thread: this process's default thread pool only fights
    the other test processes for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return problem.baseline(steps, BATCH, LR)
    finally:
        torch.set_num_threads(threads)


def _reload(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` through torch.save / torch.load(weights_only=True), as checkpoints go."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded: dict[str, Any] = torch.load(buf, weights_only=True)
    return loaded


# ---------------------------------------------------------------- EASGD, on ranks


def _easgd_exchange(ctx: Any, params: easgd.Params, periods: int) -> list[dict[str, Any]]:
    """Hand-set xᵢ, x̃ and gᵢ, then ``periods`` steps; what each step saw and did."""
    net = nn.Linear(3, 2)
    lr = 0.1
    _, opt = easgd_strategy.prepare(ctx, net, torch.optim.SGD(net.parameters(), lr=lr), params)
    ps = list(net.parameters())
    n = sum(q.numel() for q in ps)
    gen = torch.Generator().manual_seed(7)
    center = torch.randn(n, generator=gen)  # the same on every rank
    starts = [torch.randn(n, generator=gen) * 3 for _ in range(ctx.world_size)]
    assign_flat(ps, starts[ctx.rank])
    opt.center = center.clone()  # type: ignore[attr-defined]
    out = []
    for step in range(periods):
        grad = torch.full((n,), 0.5 * (ctx.rank + 1) + step)
        offset = 0
        for q in ps:
            q.grad = grad[offset : offset + q.numel()].view_as(q).clone()
            offset += q.numel()
        x, c = flat_params(ps), opt.center.clone()  # type: ignore[attr-defined]
        opt.step()
        out.append(
            {
                "x": x,
                "center": c,
                "grad": grad,
                "lr": lr,
                "rho": opt.rho,  # type: ignore[attr-defined]
                "alpha": opt.alpha,  # type: ignore[attr-defined]
                "x_after": flat_params(ps),
                "center_after": opt.center.clone(),  # type: ignore[attr-defined]
                "consensus": opt.meter.extra.get("consensus"),  # type: ignore[attr-defined]
            }
        )
    return out


def _easgd_round_trip(ctx: Any) -> dict[str, Any]:
    net = problem.model(0)
    params = easgd.Params(period=2)
    _, opt = easgd_strategy.prepare(ctx, net, torch.optim.SGD(net.parameters(), lr=0.05), params)
    x, y = problem.data(256)
    for _ in range(5):
        F.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    saved = _reload(opt.state_dict())
    fresh = problem.model(1)
    sgd = torch.optim.SGD(fresh.parameters(), lr=0.05)
    _, opt2 = easgd_strategy.prepare(ctx, fresh, sgd, params)
    before = opt2.center.clone()  # type: ignore[attr-defined]
    opt2.load_state_dict(saved)
    return {
        "center": opt.center,  # type: ignore[attr-defined]
        "loaded": opt2.center,  # type: ignore[attr-defined]
        "fresh": before,
        "local_steps": (opt.local_steps, opt2.local_steps),  # type: ignore[attr-defined]
    }


def _easgd_all(ctx: Any) -> dict[str, Any]:
    return {
        "half": _easgd_exchange(ctx, easgd.Params(alpha=0.5, period=1), 1),  # α = 1/p
        "third": _easgd_exchange(ctx, easgd.Params(alpha=0.3, period=1), 1),
        "period2": _easgd_exchange(ctx, easgd.Params(alpha=0.2, period=2), 2),
        "round_trip": _easgd_round_trip(ctx),
        "train": problem.train_on_rank(ctx, STEPS, BATCH, LR),
    }


@pytest.fixture(scope="module")
def easgd_ranks() -> list[dict[str, Any]]:
    return run_ranks(_easgd_all, 2, strategy="easgd")


def _check_center_update(steps: list[dict[str, Any]]) -> None:
    """New center = (1 − pα) x̃ + α Σ xᵢ, a convex combination of x̃ and the xᵢ."""
    p, alpha = len(steps), steps[0]["alpha"]
    c, xs = steps[0]["center"], [s["x"] for s in steps]
    new = steps[0]["center_after"]
    for s in steps:  # every rank holds the same center
        torch.testing.assert_close(s["center_after"], new)
    expected = (1 - p * alpha) * c + alpha * sum(xs)
    torch.testing.assert_close(new, expected, rtol=1e-5, atol=1e-5)
    # In the convex hull: solve [x̃ x₁ … x_p; 1 … 1] λ = [new; 1]; λ ≥ 0, exact fit.
    points = torch.stack([c, *xs], dim=1).double()
    system = torch.cat([points, torch.ones(1, p + 1, dtype=torch.float64)])
    target = torch.cat([new.double(), torch.ones(1, dtype=torch.float64)])
    weights = torch.linalg.lstsq(system, target.unsqueeze(1)).solution.squeeze(1)
    torch.testing.assert_close(system @ weights, target, rtol=0, atol=1e-5)
    assert bool((weights >= -1e-6).all()), weights
    torch.testing.assert_close(
        weights,
        torch.tensor([1 - p * alpha] + [alpha] * p, dtype=torch.float64),
        atol=1e-5,
        rtol=0,
    )
    lo, hi = torch.stack([c, *xs]).min(0).values, torch.stack([c, *xs]).max(0).values
    assert bool(((new >= lo - 1e-6) & (new <= hi + 1e-6)).all())
    # Consensus: sqrt(mean ||xᵢ − x̃||²), measured on the same differences.
    consensus = torch.sqrt(torch.stack([((x - c) ** 2).sum() for x in xs]).mean())
    assert steps[0]["consensus"] == pytest.approx(float(consensus), rel=1e-5)


def _check_worker_step(s: dict[str, Any], *, elastic: bool) -> None:
    """xᵢ ← xᵢ − η (gᵢ + ρ (xᵢ − x̃)) on a communication step, xᵢ − η gᵢ otherwise."""
    force = s["rho"] * (s["x"] - s["center"]) if elastic else 0
    expected = s["x"] - s["lr"] * (s["grad"] + force)
    torch.testing.assert_close(s["x_after"], expected, rtol=1e-5, atol=1e-5)


def test_easgd_center_update_is_a_convex_combination(easgd_ranks: list[dict[str, Any]]) -> None:
    for case in ("half", "third"):
        steps = [r[case][0] for r in easgd_ranks]
        # Default ρ = α/η: the worker's pull ηρ equals the center's rate α.
        assert steps[0]["rho"] * steps[0]["lr"] == pytest.approx(steps[0]["alpha"])
        _check_center_update(steps)
        for s in steps:
            _check_worker_step(s, elastic=True)
    # α = 1/p: the new center is the workers' mean.
    half = [r["half"][0] for r in easgd_ranks]
    torch.testing.assert_close(half[0]["center_after"], (half[0]["x"] + half[1]["x"]) / 2)


def test_easgd_exchanges_only_on_communication_steps(easgd_ranks: list[dict[str, Any]]) -> None:
    first = [r["period2"][0] for r in easgd_ranks]
    second = [r["period2"][1] for r in easgd_ranks]
    for s in first:  # step 1 of τ = 2: plain local step, the center stays
        _check_worker_step(s, elastic=False)
        torch.testing.assert_close(s["center_after"], s["center"])
    for s in second:
        _check_worker_step(s, elastic=True)
    _check_center_update(second)


def test_easgd_state_dict_round_trip_keeps_the_center(easgd_ranks: list[dict[str, Any]]) -> None:
    for r in easgd_ranks:
        rt = r["round_trip"]
        assert not torch.equal(rt["fresh"], rt["center"])  # loading did something
        torch.testing.assert_close(rt["loaded"], rt["center"], rtol=0, atol=0)
        assert rt["local_steps"] == (5, 5)


def test_easgd_converges_like_the_baseline(easgd_ranks: list[dict[str, Any]]) -> None:
    same_steps = _baseline(STEPS)
    effective = _baseline(STEPS * 2 // 3)
    for r in easgd_ranks:
        loss = r["train"]["loss"]
        assert loss <= effective * EASGD_REL_TOL, (loss, effective)
        assert loss <= same_steps + EASGD_ABS_TOL, (loss, same_steps)
        metrics = r["train"]["metrics"]
        assert metrics["comm_bytes_per_step"] > 0
        assert 0 < metrics["consensus"] < 1


# ---------------------------------------------------------------- ADMM, on ranks

LSQ_ROWS, LSQ_DIM, ROUNDS = 40, 4, 20


def lsq_data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s least-squares block: its own design and its own true model, so
    the workers' local solutions disagree and consensus has work to do."""
    gen = torch.Generator().manual_seed(100 + rank)
    a = torch.randn(LSQ_ROWS, LSQ_DIM, generator=gen) + rank
    truth = torch.randn(LSQ_DIM, generator=gen) * (rank + 1)
    return a, a @ truth + 1.0 - rank + 0.1 * torch.randn(LSQ_ROWS, generator=gen)


def _admm_least_squares(ctx: Any) -> dict[str, Any]:
    a, b = lsq_data(ctx.rank)
    torch.manual_seed(0)
    net = nn.Linear(LSQ_DIM, 1)
    params = admm.Params(rho=1.0, local_steps=100)
    _, opt = admm_strategy.prepare(ctx, net, torch.optim.SGD(net.parameters(), lr=0.05), params)
    history = []
    for _ in range(ROUNDS):
        for _ in range(params.local_steps):
            # fᵢ(x) = ½ mean (Aᵢw + c − bᵢ)²: equal row counts, so Σᵢ fᵢ has the
            # stacked least-squares solution.
            loss = 0.5 * ((net(a).squeeze(1) - b) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        history.append(dict(opt.meter.extra))  # type: ignore[attr-defined]
    saved = _reload(opt.state_dict())
    fresh = nn.Linear(LSQ_DIM, 1)
    sgd = torch.optim.SGD(fresh.parameters(), lr=0.05)
    _, opt2 = admm_strategy.prepare(ctx, fresh, sgd, params)
    opt2.load_state_dict(saved)
    return {
        "history": history,
        "z": opt.z,
        "u": opt.u,  # type: ignore[attr-defined]
        "loaded": (opt2.z, opt2.u),  # type: ignore[attr-defined]
        "x": flat_params(list(net.parameters())),
    }


def _admm_all(ctx: Any) -> dict[str, Any]:
    return {
        "lsq": _admm_least_squares(ctx),
        "train": problem.train_on_rank(ctx, STEPS, BATCH, LR),
    }


@pytest.fixture(scope="module")
def admm_ranks() -> list[dict[str, Any]]:
    return run_ranks(_admm_all, 2, strategy="admm")


def test_admm_residuals_decrease_and_z_reaches_least_squares(
    admm_ranks: list[dict[str, Any]],
) -> None:
    runs = [r["lsq"] for r in admm_ranks]
    first, last = runs[0]["history"][0], runs[0]["history"][-1]
    assert last["primal_res"] < 1e-3 * first["primal_res"], (first, last)
    assert last["dual_res"] < 1e-3 * first["dual_res"], (first, last)
    for r in runs:  # residuals and z are global: the same on every rank
        assert r["history"][-1] == pytest.approx(last)
        torch.testing.assert_close(r["z"], runs[0]["z"])
    # Σᵢ uᵢ = 0 after every z-update (z is the mean of xᵢ + uᵢ).
    torch.testing.assert_close(
        sum(r["u"] for r in runs), torch.zeros_like(runs[0]["u"]), atol=1e-5, rtol=0
    )
    blocks = [lsq_data(rank) for rank in range(len(runs))]
    a = torch.cat([torch.cat([ai, torch.ones(len(ai), 1)], dim=1) for ai, _ in blocks])
    b = torch.cat([bi for _, bi in blocks])
    solution = torch.linalg.lstsq(a.double(), b.double().unsqueeze(1)).solution.squeeze(1)
    z = runs[0]["z"].double()  # Linear(4, 1): weight (4), then bias (1)
    assert float(torch.linalg.vector_norm(z - solution)) < 1e-3 * float(
        torch.linalg.vector_norm(solution)
    ), (z, solution)


def test_admm_state_dict_round_trip_keeps_z_and_u(admm_ranks: list[dict[str, Any]]) -> None:
    for r in admm_ranks:
        z, u = r["lsq"]["loaded"]
        torch.testing.assert_close(z, r["lsq"]["z"], rtol=0, atol=0)
        torch.testing.assert_close(u, r["lsq"]["u"], rtol=0, atol=0)
        assert float(u.abs().sum()) > 0


def test_admm_converges_like_the_baseline(admm_ranks: list[dict[str, Any]]) -> None:
    baseline = _baseline(STEPS)
    for r in admm_ranks:
        assert r["train"]["loss"] <= baseline + ADMM_ABS_TOL, (r["train"]["loss"], baseline)
        metrics = r["train"]["metrics"]
        assert metrics["primal_res"] >= 0 and metrics["dual_res"] >= 0


# ---------------------------------------------------------------- control plane, no torch


def test_easgd_check_world_bounds_alpha_by_one_over_p() -> None:
    assert easgd.check_world(easgd.Params(alpha=0.6), 2) == (
        "alpha 0.6 > 1/p = 0.5 for 2 workers: the center update would overshoot"
    )
    assert easgd.check_world(easgd.Params(alpha=0.5), 2) is None
    assert easgd.check_world(easgd.Params(alpha=0.25), 4) is None
    assert easgd.check_world(easgd.Params(alpha=0.3), 4) is not None
    assert easgd.check_world(easgd.Params(beta=1.0), 8) is None  # default α = β/p
    assert easgd.resolve_alpha(easgd.Params(), 3) == pytest.approx(0.3)
    assert easgd.resolve_rho(easgd.Params(), 0.45, 0.05) == pytest.approx(9.0)
    with pytest.raises(ValueError, match=r"set strategy\.params\.rho"):
        easgd.resolve_rho(easgd.Params(), 0.45, 0.0)


def test_plan_rejects_alpha_above_one_over_p() -> None:
    cluster = ClusterSpec.model_validate(
        {"hosts": [{"name": "local", "address": "localhost", "slots": 2}]}
    )
    job = JobSpec.model_validate(
        {
            "name": "easgd",
            "script": "train.py",
            "workers": 2,
            "strategy": {"name": "easgd", "params": {"alpha": 0.6}},
        }
    )
    with pytest.raises(UsageError) as info:
        build_plan(
            cluster,
            job,
            run_id="r",
            rdzv_port=29500,
            local_python="python",
            local_run_dir="/runs/r",
        )
    assert str(info.value) == (
        "strategy 'easgd' with 2 workers: alpha 0.6 > 1/p = 0.5 for 2 workers:"
        " the center update would overshoot"
    )


@pytest.mark.parametrize(
    ("module", "params"),
    [
        (easgd, {"beta": 0}),
        (easgd, {"beta": 1.5}),
        (easgd, {"period": 0}),
        (easgd, {"alpha": 0}),
        (easgd, {"rho": 0}),
        (easgd, {"rho": -1}),
        (easgd, {"tau": 4}),
        (admm, {"rho": 0}),
        (admm, {"rho": -0.5}),
        (admm, {"local_steps": 0}),
        (admm, {"init": "zeros"}),
        (admm, {"lr": 0.1}),
    ],
)
def test_params_reject_invalid_values(module: Any, params: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        module.Params.model_validate(params)


def test_params_defaults() -> None:
    assert easgd.Params().model_dump() == {
        "period": 4,
        "beta": 0.9,
        "alpha": None,
        "rho": None,
        "final": "consensus",
        "threshold": 0.0,
    }
    assert admm.Params().model_dump() == {
        "rho": None,
        "local_steps": 10,
        "init": "average",
        "final": "consensus",
    }


def test_admm_rho_default_follows_the_optimizer() -> None:
    p = admm.Params()
    assert admm.resolve_rho(p, "adaptive", None) == 0.01
    assert admm.resolve_rho(p, "sgd", 0.01) == 1.0  # k η ρ = 10 · 0.01 · 1 ≤ 0.5
    assert admm.resolve_rho(p, "momentum", 0.2) == pytest.approx(0.25)  # 0.02 / (1 − 0.9)
    assert admm.resolve_rho(p, "momentum", 5.0) == pytest.approx(0.01)  # k η ρ capped at 0.5
    few = admm.Params(local_steps=2)
    assert admm.resolve_rho(few, "momentum", 5.0) == pytest.approx(0.05)
    assert admm.resolve_rho(admm.Params(rho=3.0), "momentum", 2.0) == 3.0
    with pytest.raises(ValueError, match=r"set strategy\.params\.rho"):
        admm.resolve_rho(p, None, None)


def test_modules_import_without_torch() -> None:
    code = (
        "import sys; import dmlctl.strategies.easgd.params, dmlctl.strategies.admm.params;"
        " assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_cli_dry_run_validates_examples_and_rejects_large_alpha(cli: Cli, tmp_path: Path) -> None:
    for name in ("easgd.yaml", "admm.yaml"):
        done = cli.run("launch", str(EXAMPLES / name), "--dry-run", "--workers", "2")
        assert done.returncode == 0, done.stdout + done.stderr
    job = (EXAMPLES / "easgd.yaml").read_text()
    job = job.replace("../quickstart", str(REPO / "examples" / "quickstart"))
    job = job.replace("# alpha: 0.45", "alpha: 0.6")
    (tmp_path / "job.yaml").write_text(job)
    done = cli.run("launch", str(tmp_path / "job.yaml"), "--dry-run", "--workers", "2")
    assert done.returncode != 0
    assert "alpha 0.6 > 1/p = 0.5 for 2 workers" in done.stdout + done.stderr
