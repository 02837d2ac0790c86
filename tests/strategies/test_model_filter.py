"""The ``threshold`` model filter on real gloo ranks. local-sgd and bmuf: a round
averages exactly the tensors whose change since their last average is large on some
worker, the others keep their change for later (nothing lost), and the bytes are
those of the tensors sent plus one flag per tensor. easgd: the center moves only
where some worker is far from it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.strategies import problem
from tests.strategies.harness import run_ranks

pytestmark = pytest.mark.integration

THRESHOLD, PERIOD, ROUNDS = 0.05, 2, 15


def _rounds(ctx: Any) -> dict[str, Any]:
    """Train the shared problem; after every round record which tensors were sent,
    every tensor's value and the round's bytes."""
    x, y = problem.data(1024)
    net = problem.model(0)
    net, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    gen = torch.Generator().manual_seed(ctx.rank)
    rounds = []
    for step in range(1, PERIOD * ROUNDS + 1):
        idx = torch.randint(len(x), (32,), generator=gen)
        loss = F.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        bytes_before = opt.meter.bytes
        opt.step()
        if step % PERIOD == 0:
            tensors = getattr(opt, "tensors", opt.params)
            rounds.append(
                {
                    "sent": list(opt.last_sent),
                    "values": [t.detach().clone().numpy() for t in tensors],
                    "reference": [s.clone().numpy() for s in opt.filter.sent],
                    "bytes": opt.meter.bytes - bytes_before,
                }
            )
    return {"rounds": rounds}


def _run(strategy: str) -> list[dict[str, Any]]:
    params = {"threshold": THRESHOLD, "period": PERIOD}
    return run_ranks(_rounds, 2, strategy=strategy, params=params)


@pytest.fixture(scope="module", params=["local-sgd", "bmuf"])
def ranks(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return _run(request.param)


def test_sent_tensors_are_averaged_and_skipped_ones_stay_below_the_threshold(
    ranks: list[dict[str, Any]],
) -> None:
    import numpy as np

    skipped_somewhere = False
    for a, b in zip(ranks[0]["rounds"], ranks[1]["rounds"], strict=True):
        assert a["sent"] == b["sent"]  # every worker sends the same tensors
        for i, (va, vb) in enumerate(zip(a["values"], b["values"], strict=True)):
            if i in a["sent"]:
                assert np.array_equal(va, vb)  # averaged
            else:
                skipped_somewhere = True
                for rank in (a, b):  # its change is carried: still below the threshold
                    change = np.linalg.norm(rank["values"][i] - rank["reference"][i])
                    assert change <= THRESHOLD * np.linalg.norm(rank["reference"][i]) + 1e-9
    assert skipped_somewhere


def test_bytes_are_the_sent_tensors_plus_one_flag_per_tensor(ranks: list[dict[str, Any]]) -> None:
    sizes = [v.size for v in ranks[0]["rounds"][0]["values"]]
    for r in ranks[0]["rounds"]:
        assert r["bytes"] == 4 * sum(sizes[i] for i in r["sent"]) + 4 * len(sizes)
    total = sum(4 * sum(sizes) for _ in ranks[0]["rounds"])
    assert sum(r["bytes"] for r in ranks[0]["rounds"]) < total  # the filter saves bytes


def test_threshold_and_hierarchical_do_not_combine() -> None:
    from dmlctl.strategies.local_sgd.params import Params

    with pytest.raises(ValueError, match="cannot be combined with hierarchical"):
        Params.model_validate({"threshold": 0.1, "hierarchical": True})


def test_easgd_moves_the_center_only_where_some_worker_is_far_from_it() -> None:
    import numpy as np

    out = _run("easgd")
    sizes = [v.size for v in out[0]["rounds"][0]["values"]]
    previous = None
    skipped = 0
    for a, b in zip(out[0]["rounds"], out[1]["rounds"], strict=True):
        assert a["sent"] == b["sent"]
        for x, y in zip(a["reference"], b["reference"], strict=True):
            assert np.array_equal(x, y)  # one center
        if previous is not None:
            for i, (now, before) in enumerate(zip(a["reference"], previous, strict=True)):
                if i not in a["sent"]:
                    skipped += 1
                    assert np.array_equal(now, before)  # no update for this tensor
        previous = a["reference"]
        # the sent tensors' differences, the consensus scalar, one flag per tensor
        assert a["bytes"] == 4 * (sum(sizes[i] for i in a["sent"]) + 1) + 4 * len(sizes)
    assert skipped
