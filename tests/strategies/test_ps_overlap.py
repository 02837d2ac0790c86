"""``overlap: true`` on real gloo ranks: the communication thread changes when a worker
sees the servers' model, never what it pushes. With one worker asgd and easgd-async
follow exactly the trajectory they follow without overlap; the bytes per step are
the same; aadmm still converges; a checkpoint taken with an exchange in flight
resumes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.strategies.harness import run_ranks
from tests.strategies.test_ps_push_filters import PULL, PUSH, W2S1, _bytes, _trajectory
from tests.strategies.test_ps_rounds import W3S1, _least_squares

pytestmark = pytest.mark.integration

W1S1 = ["worker", "server"]


@pytest.mark.parametrize(
    ("strategy", "params"),
    [("asgd", {}), ("asgd", {"push_compression": "topk"}), ("easgd-async", {"period": 2})],
)
def test_one_worker_follows_the_same_trajectory_with_overlap(
    strategy: str, params: dict[str, Any]
) -> None:
    """One worker: the model an exchange pulls holds only its own pushes, so taking it
    one exchange later changes nothing (asgd: fresh + the change since; easgd-async:
    the center right after its own push is the center it would pull)."""
    import torch

    plain = run_ranks(_trajectory, 2, strategy=strategy, params=params, args=(12,), roles=W1S1)
    overlapped = run_ranks(
        _trajectory,
        2,
        strategy=strategy,
        params={**params, "overlap": True},
        args=(12,),
        roles=W1S1,
    )
    assert plain[0] is not None and overlapped[0] is not None
    for step, (a, b) in enumerate(zip(plain[0], overlapped[0], strict=True)):
        gap = float((a - b).abs().max())
        assert torch.allclose(a, b, atol=1e-5), f"step {step} differs by {gap}"


def test_overlap_moves_the_same_bytes_per_step() -> None:
    out = run_ranks(_bytes, 3, strategy="asgd", params={"overlap": True}, roles=W2S1)
    for worker in out[:2]:
        assert worker["comm_bytes_per_step"] == PUSH["none"] + PULL


def test_aadmm_with_overlap_converges_to_the_least_squares_solution() -> None:
    import torch

    params = {"min_workers": 1, "max_delay": 2, "overlap": True}
    out = run_ranks(_least_squares, 4, strategy="aadmm", params=params, roles=W3S1, args=(60,))
    for worker in out[:3]:
        gap = torch.linalg.vector_norm(worker["w"] - worker["lstsq"]) / torch.linalg.vector_norm(
            worker["lstsq"]
        )
        assert gap < 1e-2, (gap, worker["w"], worker["lstsq"])


def _save_in_flight(ctx: Any, directory: str) -> dict[str, Any]:
    """Save while an exchange is in flight, train on, resume: the checkpoint holds the
    servers' state after that exchange, and every worker resumes from the servers'
    parameters."""
    import torch

    from dmlctl.runtime.checkpoint import CheckpointManager
    from dmlctl.runtime.resume import restore_training_state, training_state

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    model, opt = ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    assert opt.comm is not None and not opt.comm.pending
    manager = CheckpointManager(
        directory,
        ctx.rank,
        ctx.world_size,
        group=ctx.membership.group,
        src=ctx.membership.workers[0],
    )
    gen = torch.Generator().manual_seed(ctx.rank)
    for step in range(1, 9):
        x = torch.randn(8, 6, generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), torch.arange(8) % 3)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 4:
            assert opt.comm.pending  # the step's exchange runs behind
            manager.save(step, training_state(model, opt, epoch=0, batches=step, extra={}))
    found = manager.load_latest()
    assert found is not None and found[0] == 4
    restore_training_state(found[1], model, opt)
    opt.finish()
    return {"resumed": [p.detach().clone() for p in model.parameters()]}


def test_a_checkpoint_with_an_exchange_in_flight_resumes(tmp_path: Any) -> None:
    import torch

    out = run_ranks(
        _save_in_flight,
        3,
        strategy="asgd",
        params={"overlap": True},
        roles=W2S1,
        args=(str(tmp_path),),
    )
    first, second = out[0], out[1]
    assert first is not None and second is not None
    for a, b in zip(first["resumed"], second["resumed"], strict=True):
        assert torch.equal(a, b)  # both workers end on the servers' parameters
        assert torch.isfinite(a).all()
