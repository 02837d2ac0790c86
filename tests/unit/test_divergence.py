"""The divergence guard's checks: which logged keys are losses, what counts as finite
(floats and tensors alike), the parameter a non-finite buffer is blamed on, the hint,
and the optimizer and metric-logger hooks that raise — without processes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest
import torch

from dmlctl.failure import named
from dmlctl.launch.policy import FailureKind, classify
from dmlctl.ps.modes import DeltaPush, GradientPush
from dmlctl.ps.worker import Wiring
from dmlctl.runtime import divergence
from dmlctl.runtime.divergence import Diverged
from dmlctl.runtime.metrics import MetricLogger, Scalar
from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.strategies.easgd_async.mode import ElasticExchange
from tests.unit.test_ps_modes import OneServer, _setup


def _advice() -> str:
    return "lower the learning rate"


@pytest.mark.parametrize(
    ("name", "loss"),
    [
        ("loss", True),
        ("train_loss", True),
        ("val/loss", True),
        ("NLLLoss", True),
        ("aux_loss", True),
        ("accuracy", False),
        ("grad_norm", False),
        ("loss_scale", False),
        ("samples_per_s", False),
    ],
)
def test_which_logged_keys_are_losses(name: str, loss: bool) -> None:
    assert divergence.is_loss_key(name) is loss


@pytest.mark.parametrize(
    ("value", "finite"),
    [
        (0.5, True),
        (3, True),
        ("text", True),
        (True, True),
        (math.nan, False),
        (math.inf, False),
        (-math.inf, False),
        (torch.tensor(1.5), True),
        (torch.tensor(math.nan), False),
        (torch.tensor([1.0, math.inf]), False),
        (torch.tensor([1.0, 2.0], dtype=torch.float64), True),
        (torch.tensor([1, 2]), True),  # integer tensors cannot hold NaN
    ],
)
def test_floats_and_tensors_are_checked_alike(value: Any, finite: bool) -> None:
    assert divergence.is_finite(value) is finite


def test_a_non_finite_loss_names_the_strategy_step_and_key() -> None:
    values = {"loss": 0.3, "train_loss": math.nan, "accuracy": 0.9}
    with pytest.raises(Diverged) as caught:
        divergence.check_logged(values, strategy="ssgd", step=7, advice=_advice)
    assert str(caught.value) == (
        "strategy ssgd, step 7: logged 'train_loss' is nan; lower the learning rate"
    )


def test_other_keys_may_be_anything_and_the_advice_is_asked_only_on_failure() -> None:
    asked: list[int] = []

    def advice() -> str:
        asked.append(1)
        return "x"

    values = {"loss": 1.0, "grad_norm": math.inf, "note": "warmup"}
    divergence.check_logged(values, strategy="ssgd", step=1, advice=advice)
    assert asked == []


def _model() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))


def _names(model: torch.nn.Module) -> dict[int, str]:
    return {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}


def test_a_flat_buffer_is_blamed_on_the_first_non_finite_parameter() -> None:
    model = _model()
    layout = [*model.parameters(), model[1].running_mean]
    flat = torch.cat([t.detach().reshape(-1) for t in layout])
    flat[7] = math.nan  # weight has 6 elements, bias 2: element 7 is bias[1]
    flat[-1] = math.inf  # a later buffer: the first one is named
    with pytest.raises(Diverged) as caught:
        divergence.check_tensors(
            flat,
            layout,
            _names(model),
            strategy="local-sgd",
            step=40,
            where="after averaging",
            advice=_advice,
        )
    assert str(caught.value) == (
        "strategy local-sgd, step 40: parameter '0.bias' is not finite after averaging"
        " (1 NaN of 2 values); lower the learning rate"
    )


def test_a_buffer_or_an_unnamed_tensor_is_named_as_well_as_it_can_be() -> None:
    model = _model()
    layout = [*model.parameters(), model[1].running_mean]
    values = [t.detach().clone() for t in layout]
    values[-1][0] = math.nan
    kwargs: dict[str, Any] = {"strategy": "bmuf", "step": 2, "where": "here", "advice": _advice}
    with pytest.raises(Diverged, match=r"buffer '1\.running_mean' is not finite here"):
        divergence.check_tensors(values, layout, _names(model), **kwargs)
    with pytest.raises(Diverged, match=r"buffer '#4 \(shape \(2,\)\)' is not finite"):
        divergence.check_tensors(values, layout, {}, **kwargs)


def test_finite_values_pass() -> None:
    model = _model()
    layout = list(model.parameters())
    flat = torch.cat([t.detach().reshape(-1) for t in layout])
    kwargs: dict[str, Any] = {"strategy": "s", "step": 1, "where": "w", "advice": _advice}
    divergence.check_tensors(flat, layout, {}, **kwargs)
    divergence.check_tensors([t.detach() for t in layout], layout, {}, **kwargs)
    assert divergence.all_finite([])


def test_the_hint_names_the_lr_and_the_coupling_weights() -> None:
    sgd = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1000.0)
    assert divergence.hint(sgd) == "lower the learning rate (lr=1000)"
    assert divergence.hint(None) == "lower the learning rate"
    assert divergence.hint(sgd, {"rho": 0.5, "alpha": 0.45}) == (
        "lower the learning rate (lr=1000) or the coupling weights (rho=0.5, alpha=0.45)"
    )


class _Coupled(StrategyOptimizer):
    """A strategy with one coupling weight whose round leaves what it is given."""

    coupling: ClassVar[dict[str, str]] = {"rho": "penalty"}

    def __init__(self, inner: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
        super().__init__(inner, params, world_size=2)
        self.penalty = 2.0

    def communicate(self) -> None:
        self.check_finite(torch.cat([p.detach().reshape(-1) for p in self.params]))


def test_a_strategy_round_raises_with_the_bound_names_and_its_coupling() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = _Coupled(inner, list(model.parameters()))
    opt.bind_names("admm", model)
    opt.step()  # finite: nothing happens
    with torch.no_grad():
        model[0].bias.fill_(math.inf)
    with pytest.raises(Diverged) as caught:
        opt.step()
    assert str(caught.value) == (
        "strategy admm, step 2: parameter '0.bias' is not finite after the communication"
        " round (1 inf of 1 value); lower the learning rate (lr=0.1) or the coupling"
        " weights (rho=2)"
    )


def test_a_parameter_server_pull_that_is_not_finite_stops_the_worker() -> None:
    param, kwargs = _setup([1.0, 2.0])
    server = OneServer(torch.tensor([1.0, math.nan]))
    opt = DeltaPush(torch.optim.SGD([param], lr=0.5), [param], Wiring(**kwargs, channel=server))
    param.grad = torch.zeros(2)
    with pytest.raises(Diverged, match=r"step 1: parameter '#0 \(shape \(2,\)\)' is not finite"):
        opt.step()


def test_every_parameter_server_mode_checks_what_it_pulled() -> None:
    param, kwargs = _setup([1.0, 2.0])
    center = OneServer(torch.tensor([math.inf, 0.0]))
    inner = torch.optim.SGD([param], lr=0.5)
    opt: StrategyOptimizer = ElasticExchange(
        inner, [param], Wiring(**kwargs, channel=center), period=1, alpha=0.25
    )
    opt.bind_names("easgd-async", torch.nn.ParameterDict({"w": param}))
    param.grad = torch.zeros(2)
    with pytest.raises(Diverged) as caught:
        opt.step()
    assert str(caught.value) == (
        "strategy easgd-async, step 1: parameter 'w' is not finite after the elastic"
        " exchange (1 inf of 2 values); lower the learning rate (lr=0.5) or the coupling"
        " weights (alpha=0.25)"
    )
    server = OneServer(torch.tensor([0.0, 0.0]))
    advice = "raise L (L=10: the servers' largest step is 1/L; the optimizer's lr is not used)"
    opt = GradientPush(inner, [param], Wiring(**kwargs, channel=server), advice=advice)
    param.grad = torch.tensor([math.nan, 0.0])  # the server's step makes it NaN
    with pytest.raises(Diverged, match=r"step 1: parameter .* after the pull from the servers"):
        opt.step()
    assert opt.divergence_advice() == advice  # adadelay: L, not the unused lr


def test_the_metric_logger_writes_the_record_then_lets_the_check_raise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen: list[tuple[int, Mapping[str, Scalar]]] = []

    def check(step: int, values: Mapping[str, Scalar]) -> None:
        seen.append((step, dict(values)))
        divergence.check_logged(values, strategy="ssgd", step=step, advice=_advice)

    logger = MetricLogger(0, None, check=check)
    logger.log(3, {"loss": torch.tensor(0.25)})
    with pytest.raises(Diverged, match="step 4: logged 'loss' is inf"):
        logger.log(None, {"loss": torch.tensor(math.inf)})
    assert seen == [(3, {"loss": 0.25}), (4, {"loss": math.inf})]  # floats, converted once
    assert "step 4 loss=inf" in capsys.readouterr().out


def test_a_divergence_is_a_user_failure() -> None:
    cause = named("local", 0, "Diverged", "strategy ssgd, step 3: logged 'loss' is nan")
    assert classify(cause) is FailureKind.USER
