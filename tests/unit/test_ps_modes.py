"""The parameter-server worker's modes (asgd/ssp's DeltaPush, adadelay's GradientPush,
easgd-async's ElasticExchange) against one in-memory server: what each pushes, when it
pulls, and what it does with what it pulled — without processes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dmlctl.ps.bootstrap import Layout
from dmlctl.ps.channel import Pulled, WorkerChannel
from dmlctl.ps.modes import DeltaPush, GradientPush
from dmlctl.ps.worker import Wiring
from dmlctl.runtime.membership import Membership
from dmlctl.strategies.easgd_async.mode import ElasticExchange

LR = 0.5


class OneServer(WorkerChannel):
    """One shard on one in-memory server that adds every pushed tensor times ``alpha``
    (the ``scaled_add`` rule) and records what it was sent."""

    def __init__(self, start: torch.Tensor, alpha: float = 1.0) -> None:
        super().__init__(0, [1], [start.numel()])
        self.flat, self.alpha = start.clone(), alpha
        self.pushes: list[tuple[int, torch.Tensor]] = []  # (clock, flat update)
        self.pulls: list[int] = []  # clocks of the reads

    def push(
        self,
        grads: Mapping[int, torch.Tensor],
        clock: int | Mapping[int, int],
        *,
        pull: bool = False,
        lr: float | None = None,
        references: Mapping[int, torch.Tensor] | None = None,
    ) -> dict[int, Pulled]:
        assert isinstance(clock, int)
        update = grads[0].detach().reshape(-1).clone()
        self.pushes.append((clock, update))
        self.flat += self.alpha * update
        self.bytes_sent += update.numel() * update.element_size()
        return self.pull([0], clock) if pull else {}

    def pull(
        self, shard_ids: Sequence[int], clock: int, *, final: bool = False
    ) -> dict[int, Pulled]:
        del final  # one worker: nobody to wait for
        self.pulls.append(clock)
        return {0: Pulled(version=len(self.pushes), flat=self.flat.clone(), min_clock=clock)}


def _setup(start: list[float]) -> tuple[torch.nn.Parameter, dict[str, Any]]:
    """A one-tensor model at ``start`` and what a mode's constructor needs besides."""
    param = torch.nn.Parameter(torch.tensor(start))
    ctx = SimpleNamespace(
        world_size=1,
        global_rank=0,
        rank=0,
        membership=Membership(workers=(0,), servers=(1,), group=None),
        on_data_end=lambda callback: None,
        on_close=lambda callback: None,
    )
    layout = Layout(shapes=[(len(start),)], dtype="float32", plan=[[0]], workers=[0], servers=[1])
    return param, {"ctx": ctx, "layout": layout}


def _step(opt: torch.optim.Optimizer, param: torch.nn.Parameter, grad: list[float]) -> None:
    param.grad = torch.tensor(grad)
    opt.step()


def test_delta_push_sends_the_change_every_n_push_and_keeps_unpushed_change_on_pull() -> None:
    param, kw = _setup([0.0, 0.0])
    server = OneServer(torch.zeros(2), alpha=1.0)
    opt = DeltaPush(
        torch.optim.SGD([param], lr=LR), [param], Wiring(**kw, channel=server), n_push=2, n_fetch=3
    )
    _step(opt, param, [1.0, 0.0])  # local only
    assert server.pushes == [] and server.pulls == []
    _step(opt, param, [1.0, 0.0])  # push the change of two steps
    assert [c for c, _ in server.pushes] == [2]
    assert torch.equal(server.pushes[0][1], torch.tensor([-1.0, 0.0]))
    server.flat += torch.tensor([0.0, 10.0])  # another worker's update arrives
    _step(opt, param, [0.0, 2.0])  # pull at step 3: server's + the unpushed -1 on x₁
    assert server.pulls == [3]
    assert torch.equal(param.detach(), torch.tensor([-1.0, 9.0]))
    opt.flush()  # the end of the data: the change since the last push goes out
    assert torch.equal(server.pushes[-1][1], torch.tensor([0.0, -1.0]))
    opt.flush()  # nothing left to push
    assert len(server.pushes) == 2
    assert opt.metrics()["clock"] == 3.0


def test_delta_push_with_a_pull_on_every_push_reads_in_the_same_message() -> None:
    param, kw = _setup([1.0])
    server = OneServer(torch.tensor([1.0]), alpha=0.5)
    opt = DeltaPush(torch.optim.SGD([param], lr=LR), [param], Wiring(**kw, channel=server))
    _step(opt, param, [2.0])  # local 1 → 0; pushes -1, the server (×0.5) holds 0.5
    assert server.pulls == [1] and len(server.pushes) == 1
    assert torch.equal(param.detach(), torch.tensor([0.5]))


def test_gradient_push_leaves_the_step_to_the_server() -> None:
    param, kw = _setup([3.0])
    server = OneServer(torch.tensor([3.0]), alpha=-0.1)  # the server steps: x − 0.1 g
    inner = torch.optim.SGD([param], lr=LR)
    opt = GradientPush(inner, [param], Wiring(**kw, channel=server), n_fetch=2)
    _step(opt, param, [1.0])
    assert torch.equal(param.detach(), torch.tensor([3.0]))  # the inner optimizer never ran
    assert server.pulls == []
    _step(opt, param, [1.0])
    assert server.pulls == [2]
    assert param.item() == pytest.approx(2.8)
    assert [torch.equal(u, torch.tensor([1.0])) for _, u in server.pushes] == [True, True]


def test_gradient_push_refuses_sparse_gradients() -> None:
    param, kw = _setup([1.0, 2.0])
    wiring = Wiring(**kw, channel=OneServer(torch.zeros(2)))
    opt = GradientPush(torch.optim.SGD([param], lr=LR), [param], wiring)
    param.grad = torch.tensor([1.0, 0.0]).to_sparse()
    with pytest.raises(RuntimeError, match="dense"):
        opt.step()


def test_elastic_exchange_moves_towards_the_center_and_pushes_the_same_amount() -> None:
    param, kw = _setup([4.0])
    server = OneServer(torch.tensor([0.0]), alpha=1.0)
    opt = ElasticExchange(
        torch.optim.SGD([param], lr=LR), [param], Wiring(**kw, channel=server), period=2, alpha=0.25
    )
    _step(opt, param, [0.0])
    assert server.pushes == []
    _step(opt, param, [0.0])  # x = 4, x̃ = 0: e = α(x − x̃) = 1
    assert torch.equal(param.detach(), torch.tensor([3.0]))
    assert torch.equal(server.flat, torch.tensor([1.0]))
