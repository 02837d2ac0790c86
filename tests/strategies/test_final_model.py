"""One final model: after ``ctx.finish()`` (or the end of ``ctx.shard``'s data) every
worker holds the model the strategy's algorithm defines, identical on all ranks; with
``final: local`` each keeps its own replica.

Each case trains a few steps of Adam with momentum-like state on rank-specific data in
a loop of its own (no ``ctx.shard``), so the replicas drift, stops in the middle of a
period (7 steps, periods of 4 or more) and calls ``ctx.finish()`` twice (the second
call must do nothing).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.strategies import problem
from tests.strategies.harness import run_ranks

pytestmark = pytest.mark.integration

STEPS = 7
W2S1 = ["worker", "worker", "server"]


def _train(ctx: Any) -> dict[str, Any]:
    """STEPS steps on this rank's own samples, then finish(); what the optimizer held
    before finishing (center, z, w_g) and the parameters after."""
    x, y = problem.data(512)
    net = problem.model(0)
    net, opt = ctx.prepare(net, torch.optim.Adam(net.parameters(), lr=0.01))
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    for _ in range(STEPS):
        idx = torch.randint(len(x), (32,), generator=gen)
        loss = F.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    before = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    ctx.finish()
    ctx.finish()
    after = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    held = {k: _flat(getattr(opt, k)) for k in ("center", "z", "global_params") if hasattr(opt, k)}
    return {"before": before, "after": after, "held": held}


def _flat(value: Any) -> Any:
    """A strategy's variable as one flat tensor (aadmm keeps z as a list)."""
    if isinstance(value, list):
        return torch.cat([t.reshape(-1) for t in value])
    return value.clone()


CASES = [
    ("ssgd", {}, ()),
    ("local-sgd", {"period": 4}, ()),
    ("dpsgd", {"period": 2}, ()),
    ("bmuf", {"period": 4}, ()),
    ("easgd", {"period": 4}, ()),
    ("admm", {"local_steps": 4}, ()),
    ("ensemble", {"period": 4}, ()),
    ("hogwild", {}, ()),
    ("asgd", {}, W2S1),
    ("ssp", {}, W2S1),
    ("adadelay", {}, W2S1),
    ("easgd-async", {"period": 4}, W2S1),
    ("sync-ps", {"backup_workers": 1}, W2S1),
    ("aadmm", {"local_steps": 4, "min_workers": 1}, W2S1),
]


@pytest.mark.parametrize(("strategy", "params", "roles"), CASES, ids=[c[0] for c in CASES])
def test_every_worker_ends_with_the_same_model(
    strategy: str, params: dict[str, Any], roles: list[str]
) -> None:
    ranks = run_ranks(_train, len(roles) or 2, strategy=strategy, params=params, roles=roles)
    workers = [r for r in ranks if r is not None]
    assert len(workers) == 2
    torch.testing.assert_close(workers[0]["after"], workers[1]["after"], rtol=0, atol=0)
    if strategy == "local-sgd" or strategy == "dpsgd":  # the average of the replicas
        mean = (workers[0]["before"] + workers[1]["before"]) / 2
        torch.testing.assert_close(workers[0]["after"], mean)
    for key in ("center", "z", "global_params"):  # the algorithm's own variable
        if key in workers[0]["held"]:
            torch.testing.assert_close(workers[0]["after"], workers[0]["held"][key].float())


@pytest.mark.parametrize(
    "strategy", ["local-sgd", "easgd", "admm", "ensemble", "easgd-async", "aadmm"]
)
def test_final_local_keeps_each_replica(strategy: str) -> None:
    roles = W2S1 if strategy in ("easgd-async", "aadmm") else []
    params = {"final": "local", **({"local_steps": 4} if "admm" in strategy else {})}
    ranks = run_ranks(_train, len(roles) or 2, strategy=strategy, params=params, roles=roles)
    workers = [r for r in ranks if r is not None]
    for w in workers:
        torch.testing.assert_close(w["after"], w["before"], rtol=0, atol=0)
    assert not torch.equal(workers[0]["after"], workers[1]["after"])
