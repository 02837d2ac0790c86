"""restart.mode: in_place with a checkpoint: the first worker writes the shared file
alone, every other worker keeps its own part beside it, and after a full restart
each worker resumes its own optimizer and strategy state (ADMM's duals, Adam's
moments), model and RNGs — not the first worker's (gloo ranks of the warm pool)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dmlctl import protocol
from dmlctl.runtime.own_checkpoint import OwnPart, part_dir
from tests.strategies.harness import run_ranks

pytestmark = pytest.mark.integration

EVERY = 5


def _env(root: Path) -> dict[str, str]:
    return {
        protocol.ENV_RESTART_MODE: protocol.IN_PLACE,
        protocol.ENV_CHECKPOINT_DIR: str(root),
        protocol.ENV_CHECKPOINT_EVERY_STEPS: str(EVERY),
    }


def _flat(state: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) state dict, in a stable order."""
    if isinstance(state, torch.Tensor):
        return [state.detach().clone()]
    if isinstance(state, dict):
        return [t for k in sorted(state, key=str) for t in _flat(state[k])]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in _flat(v)]
    return []


def _train(ctx: Any, steps: int) -> dict[str, Any]:
    """Resume, then train to ``steps`` on this worker's own data (checkpointing every
    :data:`EVERY` steps); what it resumed with and what it ends with."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model, opt = ctx.prepare(model, torch.optim.Adam(model.parameters(), lr=0.05))
    start = ctx.resume(model, opt)
    resumed = {"step": start, **_states(opt), "rng": torch.rand(1)}
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    for step in range(start + 1, steps + 1):
        x = torch.randn(16, 4, generator=gen)
        loss = ((model(x) - x.sum(1, keepdim=True) * (1 + ctx.rank)) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.checkpoint(step, model, opt)
    return {"resumed": resumed, **_states(opt), "rng": torch.rand(1)}


def _states(opt: Any) -> dict[str, list[torch.Tensor]]:
    """The whole optimizer state (the strategy's included) and the inner optimizer's
    alone (Adam's moments)."""
    inner = getattr(opt, "inner", opt)
    return {"optimizer": _flat(opt.state_dict()), "moments": _flat(inner.state_dict())}


def _twice(root: Path, strategy: str, steps: int) -> list[Any]:
    """:func:`_train` on 2 workers (and a server for asgd): the workers' results."""
    roles = ["worker", "worker", "server"] if strategy == "asgd" else []
    ranks = run_ranks(
        _train, len(roles) or 2, strategy=strategy, args=(steps,), env=_env(root), roles=roles
    )
    return ranks[:2]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("strategy", ["admm", "local-sgd", "asgd"])
def test_every_worker_resumes_its_own_state_after_a_full_restart(
    tmp_path: Path, strategy: str
) -> None:
    """Synchronous workers take their own part of the agreed step; a parameter-server
    worker (asgd) its newest part's optimizer state and RNGs (its model is the
    servers', its position the run's store's: what its strategy holds of them is
    not compared)."""
    first = _twice(tmp_path, strategy, 2 * EVERY)
    saved = sorted(p.name for p in tmp_path.rglob("*.pt"))
    assert saved == ["rank-0.pt", "rank-0.pt", "step-000000005.pt", "step-000000010.pt"], saved
    assert [s for s, _ in OwnPart(tmp_path, 1, **_kw()).parts()] == [10, 5]
    assert not _same(first[0]["moments"], first[1]["moments"])  # per-worker state
    key = "moments" if strategy == "asgd" else "optimizer"

    again = _twice(tmp_path, strategy, 2 * EVERY)
    for rank in (0, 1):
        resumed = again[rank]["resumed"]
        assert resumed["step"] == 2 * EVERY
        assert _same(resumed[key], first[rank][key]), rank
        assert torch.equal(resumed["rng"], first[rank]["rng"]), rank  # its own RNGs


def test_without_its_own_part_a_worker_resumes_from_the_first_workers_state(
    tmp_path: Path,
) -> None:
    first = run_ranks(_train, 2, strategy="local-sgd", args=(EVERY,), env=_env(tmp_path))
    for part in part_dir(tmp_path, 1).iterdir():
        part.unlink()
    again = run_ranks(_train, 2, strategy="local-sgd", args=(EVERY,), env=_env(tmp_path))
    assert [r["resumed"]["step"] for r in again] == [EVERY, EVERY]
    assert _same(again[1]["resumed"]["optimizer"], first[0]["optimizer"])


def test_without_its_part_of_the_agreed_step_a_worker_takes_its_earlier_part(
    tmp_path: Path,
) -> None:
    """As with ``every_seconds``, where each worker saves by its own clock: the model
    is the writer's of the agreed step, the optimizer state the worker's own, older."""
    run_ranks(_train, 2, strategy="admm", args=(2 * EVERY,), env=_env(tmp_path))
    (part_dir(tmp_path, 1) / "step-000000010.pt").unlink()
    earlier = OwnPart(tmp_path, 1, **_kw()).load(EVERY)
    assert earlier is not None
    again = run_ranks(_train, 2, strategy="admm", args=(2 * EVERY,), env=_env(tmp_path))
    assert again[1]["resumed"]["step"] == 2 * EVERY
    assert _same(again[1]["resumed"]["optimizer"], _flat(earlier[1]["optimizer"]))


def test_a_part_of_another_run_is_not_used(tmp_path: Path) -> None:
    part = OwnPart(tmp_path, 1, **_kw(run_id="run-a"))
    part.save(5, {"optimizer": {"x": torch.ones(1)}})
    assert part.load(5) is not None and part.load(None) is not None and part.load(10) is None
    assert part.load(10, at_most=True) is not None and part.load(4, at_most=True) is None
    assert OwnPart(tmp_path, 1, **_kw(run_id="run-b")).load(5) is None
    assert OwnPart(tmp_path, 1, **_kw(run_id="run-b", warm_start=True)).load(5) is not None


def test_parts_are_pruned_to_keep_and_due_on_their_own_steps(tmp_path: Path) -> None:
    part = OwnPart(tmp_path, 3, **{**_kw(), "keep": 2})
    assert [s for s in range(1, 13) if part.due(s)] == [5, 10]
    for step in (5, 10, 15):
        part.save(step, {"w": torch.zeros(1)})
    assert not part.due(15)
    assert [s for s, _ in part.parts()] == [15, 10]
    assert not list(part.dir.glob(".tmp-*"))


def _kw(run_id: str | None = None, warm_start: bool = False) -> dict[str, Any]:
    return {
        "keep": 3,
        "every_steps": EVERY,
        "every_seconds": None,
        "run_id": run_id,
        "warm_start": warm_start,
    }
