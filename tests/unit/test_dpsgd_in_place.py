"""D-PSGD over the elastic group (``restart.mode: in_place``): the headers that level
members one collective apart, and a replacement's first round. Three real gloo members
in threads (one store client each); no process dies here (the integration test kills
one)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch

from dmlctl.runtime import rejoin
from dmlctl.runtime.signed_store import SignedStore
from dmlctl.strategies.dpsgd.in_place import ElasticGossip
from dmlctl.strategies.dpsgd.params import Params
from dmlctl.strategies.elastic import ElasticAverager

Script = Callable[[ElasticGossip], Any]


def _members(
    monkeypatch: pytest.MonkeyPatch, scripts: list[Script], holding: list[bool]
) -> tuple[dict[int, Any], dict[int, torch.Tensor]]:
    """Members ``0 … n-1`` on a ring, each with the one parameter ``[rank]``, form a
    generation and run their script; what each returned and its parameter after."""
    from torch._C._distributed_c10d import TCPStore

    server = TCPStore("127.0.0.1", 0, 1, True)
    mine = threading.local()  # a client each: one blocks while it waits for a key
    monkeypatch.setattr(rejoin, "store", lambda: SignedStore(mine.store))
    out: dict[int, Any] = {}
    final: dict[int, torch.Tensor] = {}
    n = len(scripts)

    def member(rank: int) -> None:
        mine.store = TCPStore("127.0.0.1", server.port, is_master=False)
        group = ElasticAverager(rank, n, timedelta(seconds=30))
        group.holding = holding[rank]
        weight = torch.nn.Parameter(torch.tensor([float(rank)]))
        inner = torch.optim.SGD([weight], lr=0.1)
        opt = ElasticGossip(inner, [weight], rank=rank, world_size=n, settings=Params())
        opt.elastic = group
        try:
            group._form()
            out[rank] = scripts[rank](opt)
        except RuntimeError as exc:  # said, not lost in the thread
            out[rank] = str(exc)
        final[rank] = weight.detach().clone()

    threads = [threading.Thread(target=member, args=(r,)) for r in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), out
    return out, final


def _at(steps: int, *calls: Callable[[ElasticGossip], Any]) -> Script:
    """A script: the optimizer at ``steps``, then each call (between them, a step's
    worth: the count goes up by one), returning what each returned."""

    def script(opt: ElasticGossip) -> list[Any]:
        opt.local_steps = steps
        said = []
        for call in calls:
            said.append(call(opt))
            opt.local_steps += 1
        return said

    return script


def _mix(opt: ElasticGossip) -> Any:
    return opt._collective(1)


def test_members_one_round_apart_are_levelled_by_their_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Member 0 went on past a round the others did not complete (a lost member's
    all-to-all that only it finished): they skip that round, and all three mix at the
    next one, together."""
    out, final = _members(
        monkeypatch,
        [_at(5, _mix), _at(4, _mix, _mix), _at(4, _mix, _mix)],
        [True, True, True],
    )
    assert out[0] == [(1, 0.0, 5)], out
    assert out[1] == out[2] == [None, (1, 0.0, 5)], out
    # Metropolis weights on a ring of 3: a third each, so every member holds the mean.
    for rank in range(3):
        assert final[rank].item() == pytest.approx(1.0)


def test_a_replacement_takes_its_neighbours_mean_and_their_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The replacement (rank 1) brings no model: its neighbours mix without it (their
    weights renormalised), it takes their mean and the round's step; a consensus the
    others measure first it joins with nothing."""
    out, final = _members(
        monkeypatch,
        [
            _at(9, lambda o: o.consensus(), _mix),
            lambda opt: opt.joining_round(),
            _at(9, lambda o: o.consensus(), _mix),
        ],
        [True, False, True],
    )
    assert out[1] == 10 and out[0][0] == out[2][0] == pytest.approx(1.0), out  # |0-1|, |2-1|
    assert final[1].item() == pytest.approx(1.0)  # (0 + 2) / 2
    assert final[0].item() == final[2].item() == pytest.approx(1.0)  # own and the other's
