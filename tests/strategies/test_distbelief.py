"""DistBelief on real gloo ranks: asgd across 2 replicas of scikit-learn's digits CNN,
each replica split over 2 ranks (tensor parallelism: the classifier's two linear
layers), 2 parameter servers holding each part's shards. It reaches the
single-process accuracy (within :data:`TOLERANCES`), every worker of a part ends with
the same tensors, and every shard's staleness is recorded by its server and bounded.
With one replica the same run is the single-process training exactly (measured:
0.9806, the baseline's accuracy), which is what the mechanics must give."""

from __future__ import annotations

from typing import Any

import pytest

from dmlctl.mesh import MeshLayout, dumps
from tests.strategies.harness import run_ranks
from tests.strategies.test_accuracy import EPOCHS, _digits, baseline  # noqa: F401

pytestmark = pytest.mark.integration

ROLES = ["worker"] * 4 + ["server"] * 2
LAYOUT = MeshLayout(dp_replicate=2, tp=2)
TOLERANCES = {"adam": 0.015, "momentum": 0.02}
"""Points below one process: with Adam 1.5 as the accuracy table (measured 0.9778
twice against 0.9806); SGD + momentum loses more to the replicas' asynchrony,
0.9639–0.9750 over 5 runs (mean 0.968), as plain asgd does on a loaded machine."""
STALENESS_BOUND = 32
"""The most updates a shard may receive between a worker's pull and its push: with 2
replicas exchanging every step, the steps the other replica took meanwhile
(measured 4–11 on 2 cores running 6 processes)."""


def _train(ctx: Any, opt_name: str) -> dict[str, Any]:
    """The digits training of the accuracy table, by hand so the optimizer is at hand:
    this worker's test accuracy, the digest of its tensors, its part, and (worker 0)
    every server's staleness by shard."""
    import torch
    import torch.nn.functional as F

    digits = _digits()
    train_set, (x_te, y_te) = digits.data()
    net = digits.model(0)
    net, opt = ctx.prepare(net, digits.optimizer(opt_name, net.parameters()))
    for step, (x, y) in enumerate(ctx.shard(train_set, batch_size=32, epochs=EPOCHS), start=1):
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            ctx.log(loss=loss)
    with torch.no_grad():
        acc = float((net(x_te).argmax(1) == y_te).float().mean())
    servers = {}
    if ctx.rank == 0:
        from dmlctl.ps.server import loads

        for server in opt.layout.servers:
            state = loads(opt.channel.snapshot(server))
            servers[server] = dict(state["shard_staleness_max"])
    return {"acc": acc, "digest": digits.digest(net), "part": opt.part, "servers": servers}


@pytest.mark.parametrize("opt_name", ["momentum", "adam"])
def test_distbelief_reaches_the_single_process_accuracy(
    opt_name: str,
    baseline: dict[str, float],  # noqa: F811
) -> None:
    out = run_ranks(
        _train,
        len(ROLES),
        strategy="asgd",
        args=(opt_name,),
        roles=ROLES,
        env={"DMLCTL_PARALLELISM": dumps(LAYOUT)},
        timeout=300,
    )
    workers = [w for w in out if w is not None]
    assert len(workers) == 4
    accs = [w["acc"] for w in workers]
    assert min(accs) >= baseline[opt_name] - TOLERANCES[opt_name], (accs, baseline[opt_name])
    by_part: dict[int, set[str]] = {}
    for w in workers:
        by_part.setdefault(w["part"], set()).add(w["digest"])
    assert sorted(by_part) == [0, 1] and all(len(d) == 1 for d in by_part.values()), by_part
    servers = workers[0]["servers"]
    shards = [s for per_server in servers.values() for s in per_server]
    assert len(servers) == 2 and sorted(shards) == [0, 1], servers  # one part per server
    worst = max(v for per_server in servers.values() for v in per_server.values())
    assert 0 < worst <= STALENESS_BOUND, servers
