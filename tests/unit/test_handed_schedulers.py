"""A worker replaced in place gets the live worker's LR schedulers' counters
(:mod:`dmlctl.runtime.schedulers`): the handover carries them, the replacement's own
schedulers — made by its script after ``ctx.prepare`` — take them at its first step."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch.optim.lr_scheduler import (
    ChainedScheduler,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)

from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.runtime.signed_store import SignedStore
from dmlctl.strategies.elastic_start import _with_schedulers, optimizer_handover


def _worker() -> tuple[torch.nn.Parameter, StrategyOptimizer]:
    weight = torch.nn.Parameter(torch.zeros(2))
    inner = torch.optim.SGD([weight], lr=1.0, momentum=0.9)
    return weight, StrategyOptimizer(inner, [weight], world_size=1)


def _train(weight: torch.nn.Parameter, opt: StrategyOptimizer, *scheds: object) -> None:
    weight.grad = torch.ones(2)
    opt.step()
    for sched in scheds:
        sched.step()  # type: ignore[attr-defined]


def test_the_replacements_schedulers_go_on_from_the_live_workers() -> None:
    halve = lambda step: 0.5**step  # noqa: E731
    live_weight, live = _worker()
    live_scheds = (LambdaLR(live, halve), StepLR(live.inner, step_size=2, gamma=0.1))
    for _ in range(3):
        _train(live_weight, live, *live_scheds)
    handed = io.BytesIO()
    torch.save(_with_schedulers(optimizer_handover(live.inner), live).save(), handed)
    handed.seek(0)

    weight, new = _worker()
    _with_schedulers(optimizer_handover(new.inner), new).load(torch.load(handed, weights_only=True))
    scheds = (LambdaLR(new, halve), StepLR(new.inner, step_size=2, gamma=0.1))  # its script's
    assert new.param_groups[0]["lr"] == 1.0  # as a new scheduler sets it, until the step
    for _ in range(2):
        _train(live_weight, live, *live_scheds)
        _train(weight, new, *scheds)
        assert [s.last_epoch for s in scheds] == [s.last_epoch for s in live_scheds]
        assert new.param_groups[0]["lr"] == live.param_groups[0]["lr"]
    assert live_scheds[0].last_epoch == 5 and new.handed_schedulers is None


def test_a_scheduler_that_counts_steps_takes_the_round_the_replacement_joined() -> None:
    """The live worker hands its state over from inside step 4's round (its optimizer
    counted the step, its scheduler not yet); the replacement completed that round as
    it joined and goes on at step 5: its scheduler takes step 4's count first, as the
    live worker's does once the round is over."""
    live_weight, live = _worker()
    live_sched = LambdaLR(live, lambda step: 0.5**step)
    for _ in range(3):
        _train(live_weight, live, live_sched)
    live.local_steps += 1  # inside step 4's round
    saved = _with_schedulers(optimizer_handover(live.inner), live).save()
    live_sched.step()  # the round is over
    weight, new = _worker()
    _with_schedulers(optimizer_handover(new.inner), new).load(saved)
    sched = LambdaLR(new, lambda step: 0.5**step)
    weight.grad = torch.ones(2)
    new.step()  # step 5
    assert sched.last_epoch == live_sched.last_epoch == 4
    assert new.param_groups[0]["lr"] == live.param_groups[0]["lr"] == 0.5**4


def test_a_replacement_without_schedulers_of_those_kinds_keeps_its_own() -> None:
    live_weight, live = _worker()
    live_sched = StepLR(live, step_size=1, gamma=0.5)
    _train(live_weight, live, live_sched)
    saved = _with_schedulers(optimizer_handover(live.inner), live).save()
    weight, new = _worker()
    _with_schedulers(optimizer_handover(new.inner), new).load(saved)
    own = LambdaLR(new, lambda step: 1.0)
    _train(weight, new, own)
    assert own.last_epoch == 1 and new.param_groups[0]["lr"] == 1.0


def test_a_strategys_optimizer_shows_the_inner_ones_groups_after_it_loaded_a_state() -> None:
    """``load_state_dict`` (a checkpoint's, a handover's) gives the inner optimizer new
    parameter groups: a scheduler or a script that sets the wrapper's learning rate
    afterwards sets the one the inner optimizer steps with."""
    weight, opt = _worker()
    opt.load_state_dict(opt.state_dict())
    opt.param_groups[0]["lr"] = 0.25
    assert opt.inner.param_groups[0]["lr"] == 0.25 and opt.state is opt.inner.state
    sched = StepLR(opt, step_size=1, gamma=0.5)
    _train(weight, opt, sched)
    assert opt.inner.param_groups[0]["lr"] == 0.125


class _Warmup:
    """A scheduler's function as an object, holding what no safe loader takes."""

    def __init__(self) -> None:
        self.config = _Warmup  # a class: not plain data

    def __call__(self, step: int) -> float:
        return min(1.0, (step + 1) / 10)


def test_a_scheduler_whose_state_is_no_plain_data_starts_again_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    live_weight, live = _worker()
    live_sched = LambdaLR(live, _Warmup())
    _train(live_weight, live, live_sched)
    handed = io.BytesIO()
    torch.save(_with_schedulers(optimizer_handover(live.inner), live).save(), handed)
    handed.seek(0)  # the handover itself still loads safely
    weight, new = _worker()
    _with_schedulers(optimizer_handover(new.inner), new).load(torch.load(handed, weights_only=True))
    own = LambdaLR(new, _Warmup())
    _train(weight, new, own)
    assert own.last_epoch == 1  # its own count
    assert "LR scheduler LambdaLR starts again" in capsys.readouterr().out


@pytest.mark.parametrize(
    "make",
    [
        lambda o: SequentialLR(o, [LinearLR(o, 0.5, total_iters=3), ExponentialLR(o, 0.9)], [3]),
        lambda o: ChainedScheduler([LinearLR(o, 0.5, total_iters=3), ExponentialLR(o, 0.9)]),
        lambda o: ReduceLROnPlateau(o),
    ],
    ids=["sequential", "chained", "plateau"],
)
def test_composite_and_metric_schedulers_go_on_from_the_live_workers(make: Any) -> None:
    """Inside step 6's round: a SequentialLR or ChainedScheduler is loaded and stepped
    as one (the schedulers inside it not again on their own), a ReduceLROnPlateau is
    loaded and never stepped without its metric."""
    live_weight, live = _worker()
    live_sched = make(live)
    plateau = isinstance(live_sched, ReduceLROnPlateau)
    for _ in range(5):
        live_weight.grad = torch.ones(2)
        live.step()
        live_sched.step(*([1.0] if plateau else []))
    live.local_steps += 1  # inside step 6's round
    saved = _with_schedulers(optimizer_handover(live.inner), live).save()
    live_sched.step(*([1.0] if plateau else []))
    weight, new = _worker()
    _with_schedulers(optimizer_handover(new.inner), new).load(saved)
    sched = make(new)
    weight.grad = torch.ones(2)
    new.step()
    assert new.param_groups[0]["lr"] == pytest.approx(live.param_groups[0]["lr"])
    if not plateau:
        sched.step()
        live_sched.step()
        assert new.param_groups[0]["lr"] == pytest.approx(live.param_groups[0]["lr"])


def test_two_schedulers_of_a_kind_are_not_handed_over(capsys: pytest.CaptureFixture[str]) -> None:
    live_weight, live = _worker()
    scheds = (StepLR(live, 1, 0.5), StepLR(live.inner, 2, 0.1))
    _train(live_weight, live, *scheds)
    saved = _with_schedulers(optimizer_handover(live.inner), live).save()
    assert saved["schedulers"]["states"] == []
    assert "StepLR: more than one of a kind" in capsys.readouterr().out


def test_a_parameter_server_worker_keeps_its_schedulers_in_the_store_for_its_replacement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No live peer to copy: the worker writes its schedulers' state to the run's store
    at most every MIRROR_S seconds (as it steps, before the script steps them); the
    replacement reads it and its own scheduler goes on from there."""
    from torch._C._distributed_c10d import TCPStore

    from dmlctl.runtime import rejoin, schedulers

    store = TCPStore("127.0.0.1", 0, 1, True)
    monkeypatch.setattr(rejoin, "store", lambda: SignedStore(store))
    mirror = schedulers.Mirror("schedulers/1")
    assert mirror.read() is None
    weight, live = _worker()
    sched = StepLR(live.inner, step_size=2, gamma=0.1)
    for _ in range(3):  # published at the first step only: the next ones are not due
        weight.grad = torch.ones(2)
        live.step()
        mirror.publish(live, live.inner)
        sched.step()
    handed = schedulers.Mirror("schedulers/1").read()
    assert handed is not None and handed.states[0][0] == "StepLR"
    assert handed.states[0][1]["last_epoch"] == 0 and handed.steps == 1
    monkeypatch.setattr(rejoin, "MIRROR_S", 0.0)
    mirror.publish(live, live.inner)  # due now: the state after three steps
    handed = schedulers.Mirror("schedulers/1").read()
    assert handed is not None and handed.states[0][1]["last_epoch"] == 3
    _, new = _worker()
    own = StepLR(new.inner, step_size=2, gamma=0.1)
    assert schedulers.adopt(handed, new, new.inner) == ["StepLR"]
    assert own.last_epoch == 3 and new.param_groups[0]["lr"] == live.param_groups[0]["lr"]
    _, later = _worker()  # its predecessor had taken 5 batches: the copy is 2 behind
    stepped = StepLR(later.inner, step_size=2, gamma=0.1)
    assert schedulers.adopt(handed, later, later.inner, at=5) == ["StepLR"]
    assert stepped.last_epoch == 5 and later.param_groups[0]["lr"] == pytest.approx(0.01)
