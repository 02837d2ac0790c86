"""A rank's strategy travels as one value (name and parameters together, in the
agent's configuration) and is validated once per process: the entry's guards and
``dmlctl.init()`` get the same parameters, checked once."""

from __future__ import annotations

import pytest

from dmlctl import protocol
from dmlctl.agent_config import StrategyChoice
from dmlctl.runtime.env import StrategyParams, chosen_strategy, read_env
from dmlctl.strategies import registry


def test_the_strategy_is_validated_once_per_process() -> None:
    calls: list[str] = []

    def describe(name: str) -> StrategyParams:
        calls.append(name)
        return registry.load(name)

    env = StrategyChoice("local-sgd", {"period": 7}).env()
    first = chosen_strategy(env, describe)
    again = chosen_strategy(dict(env), describe)
    assert first[0] == "local-sgd" and first[2] is again[2]
    assert read_env(env, describe).params is first[2]
    assert calls == ["local-sgd"]
    assert first[2].model_dump(exclude_unset=True) == {"period": 7}


def test_bad_parameters_are_named_on_every_call() -> None:
    env = StrategyChoice("local-sgd", {"period": "often"}).env()
    for _ in range(2):
        with pytest.raises(ValueError, match="DMLCTL_STRATEGY_PARAMS is invalid for strategy"):
            chosen_strategy(env, registry.load)


def test_without_variables_it_is_ssgd_with_its_defaults() -> None:
    name, module, params = chosen_strategy({}, registry.load)
    assert name == protocol.DEFAULT_STRATEGY and isinstance(params, module.Params)
