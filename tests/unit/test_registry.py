"""The strategy registry: names, lazy modules, and which strategies need the runtime."""

from __future__ import annotations

import pytest

from dmlctl.strategies import registry


def test_none_is_registered_and_takes_no_parameters() -> None:
    module = registry.load("none")
    assert "none" in registry.names() and module.ROLES == ("worker",)
    assert module.Params.model_validate({}).model_dump() == {}
    with pytest.raises(ValueError, match="extra"):
        module.Params.model_validate({"period": 4})


@pytest.mark.parametrize(
    ("name", "params", "needed"),
    [
        ("none", {}, False),
        ("ssgd", {}, False),  # what a plain DDP script does itself
        ("ssgd", {"compression": "powersgd"}, True),  # only ctx.prepare installs the hook
        ("ssgd", {"bucket_cap_mb": 50}, True),
        ("local-sgd", {}, True),
        ("asgd", {}, True),
    ],
)
def test_which_strategies_only_work_through_ctx_prepare(
    name: str, params: dict[str, object], needed: bool
) -> None:
    model = registry.load(name).Params.model_validate(params)
    assert registry.needs_runtime(name, model) is needed
