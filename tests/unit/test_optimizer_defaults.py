"""The defaults strategies derive from the user's optimizer: its family, its
steady-state step, and the rules of adadelay (L), admm (ρ) and bmuf (η_b)."""

from __future__ import annotations

import pytest
import torch

from dmlctl.strategies import optimizers
from dmlctl.strategies.adadelay.params import Params as AdaDelayParams
from dmlctl.strategies.adadelay.params import resolve_l


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(3))]


@pytest.mark.parametrize(
    ("make", "family", "effective"),
    [
        (lambda p: torch.optim.SGD(p, lr=0.1), "sgd", 0.1),
        (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), "momentum", 0.5),
        (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True), "momentum", 0.5),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, dampening=0.5), "momentum", 0.1),
        (lambda p: torch.optim.Adam(p, lr=1e-3), "adaptive", None),
        (lambda p: torch.optim.AdamW(p, lr=1e-3), "adaptive", None),
        (lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.9), "adaptive", None),
        (lambda p: torch.optim.Adagrad(p, lr=1e-2), "adaptive", None),
    ],
)
def test_family_and_effective_step(make: object, family: str, effective: float | None) -> None:
    opt = make(_params())  # type: ignore[operator]
    assert optimizers.family(opt) == family
    got = optimizers.effective_lr(opt)
    assert got == (None if effective is None else pytest.approx(effective))


def test_an_unknown_optimizer_has_no_family() -> None:
    class Custom(torch.optim.Optimizer):
        def __init__(self, params: list[torch.nn.Parameter]) -> None:
            super().__init__(params, {"lr": 0.1})

    opt = Custom(_params())
    assert optimizers.family(opt) is None
    assert optimizers.effective_lr(opt) is None
    assert optimizers.first_lr(opt) == 0.1


@pytest.mark.parametrize(
    ("make", "carries"),
    [
        (lambda p: torch.optim.SGD(p, lr=0.1), False),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), True),
        (lambda p: torch.optim.AdamW(p, lr=1e-3), True),
        (lambda p: torch.optim.Adam(p, lr=1e-3, betas=(0.0, 0.99)), False),
        (lambda p: torch.optim.RMSprop(p, lr=1e-3), False),
        (lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5), True),
        (lambda p: torch.optim.Adagrad(p, lr=1e-2), False),
    ],
)
def test_carries_momentum_reads_momentum_and_adams_first_moment(
    make: object, carries: bool
) -> None:
    opt = make([torch.nn.Parameter(torch.zeros(2))])  # type: ignore[operator]
    assert optimizers.carries_momentum(opt) is carries


def test_describe_names_what_the_defaults_come_from() -> None:
    p = _params()
    assert optimizers.describe(torch.optim.Adam(p, lr=1e-3)) == "Adam (lr 0.001)"
    sgd = torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True)
    assert optimizers.describe(sgd) == "SGD (lr 0.05, momentum 0.9, nesterov)"


def test_adadelay_l_follows_the_optimizer_it_replaces() -> None:
    p = AdaDelayParams()
    assert resolve_l(p, "sgd", 0.1, 0.1) == pytest.approx(10.0)  # largest step = lr
    assert resolve_l(p, "momentum", 0.05, 0.5) == pytest.approx(1 / 0.025**0.5)  # √(lr·η)
    assert resolve_l(p, "adaptive", 1e-3, None) == pytest.approx(10.0)  # step 100 × lr
    assert resolve_l(AdaDelayParams(L=4.0), "adaptive", 1e-3, None) == 4.0
    with pytest.raises(ValueError, match=r"set strategy\.params\.L"):
        resolve_l(p, None, 0.1, None)
    with pytest.raises(ValueError, match=r"set strategy\.params\.L"):
        resolve_l(p, "sgd", 0.0, 0.0)
