"""A rank without a ``parallelism:`` block imports neither torch.distributed.checkpoint
nor torch.distributed.pipelining: dmlctl imports them only for a laid-out model. (DTensor
and FSDP come with torch's own optimizers, through dynamo, so every script has them.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.strategies.harness import run_ranks

pytestmark = pytest.mark.integration

HEAVY = ("torch.distributed.checkpoint", "torch.distributed.pipelining")


def _train_and_checkpoint(ctx: Any) -> list[str]:
    """Prepare, train two steps, checkpoint and resume; the heavy modules loaded."""
    import torch

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ctx.prepare(model, opt)
    ctx.resume(model, opt)
    for step in range(2):
        torch.nn.functional.mse_loss(model(torch.ones(3, 4)), torch.zeros(3, 2)).backward()
        opt.step()
        opt.zero_grad()
        ctx.checkpoint(step + 1, model, opt)
    return sorted(m for m in HEAVY if m in sys.modules)


@pytest.mark.parametrize(
    ("strategy", "roles"), [("ssgd", ()), ("asgd", ("worker", "worker", "server"))]
)
def test_a_run_without_parallelism_imports_none_of_it(
    strategy: str, roles: tuple[str, ...], tmp_path: Path
) -> None:
    env = {"DMLCTL_CHECKPOINT_DIR": str(tmp_path), "DMLCTL_CHECKPOINT_EVERY_STEPS": "1"}
    out = run_ranks(
        _train_and_checkpoint, len(roles) or 2, strategy=strategy, roles=roles, env=env, fresh=True
    )
    assert [r for r in out if r is not None] == [[], []]
    assert (tmp_path / "step-000000002").is_dir()
