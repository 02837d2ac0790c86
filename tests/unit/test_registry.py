"""The strategy registry: names, lazy modules, and which strategies need the runtime."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dmlctl.strategies import registry

REPO = Path(__file__).resolve().parents[2]


def test_none_is_registered_and_takes_no_parameters() -> None:
    module = registry.load("none")
    assert "none" in registry.names() and module.CAPABILITIES.roles == ("worker",)
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


def test_every_strategy_is_a_package_whose_params_module_is_torch_free() -> None:
    """The control plane imports each strategy's params module only: loading every one,
    validating its defaults and asking whether it needs the runtime imports no torch."""
    code = (
        "import sys\n"
        "from dmlctl.strategies import registry\n"
        "for name in registry.names():\n"
        "    module = registry.load(name)\n"
        "    assert module.__name__ == registry.entry(name).package + '.params', name\n"
        "    assert module.CAPABILITIES.roles and 'worker' in module.CAPABILITIES.roles, name\n"
        "    registry.needs_runtime(name, module.Params())\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_every_strategy_has_a_runtime_module_with_prepare_and_servers_serve() -> None:
    for name in registry.names():
        module = registry.load_runtime(name)
        entry = registry.entry(name)
        assert module.__name__ == entry.module == f"{entry.package}.strategy"
        assert callable(module.prepare), name
        serves = "server" in registry.capabilities(name).roles
        assert callable(getattr(module, "serve", None)) is serves, name


def test_unknown_names_are_answered_with_the_valid_list() -> None:
    for lookup in (registry.load, registry.load_runtime, registry.entry):
        with pytest.raises(registry.UnknownStrategy, match="valid: aadmm, adadelay, admm"):
            lookup("nope")


def test_every_params_model_survives_a_dump_and_validate_round_trip() -> None:
    """Strategies re-validate their params from ``model_dump()`` (``params_as``,
    ``check_world``): that must never turn defaults into conflicting settings."""
    examples = {
        "ssgd": {"compression": "topk", "topk_density": 0.05},
        "asgd": {"push_compression": "topk", "push_density": 0.05},
        "sync-ps": {"backup_workers": 1, "push_compression": "int8"},
        "local-sgd": {"threshold": 0.1},
    }
    for name in registry.names():
        module = registry.load(name)
        for given in ({}, examples.get(name, {})):
            params = module.Params.model_validate(given)
            again = module.Params.model_validate(params.model_dump())
            assert again == params, name
            check = getattr(module, "check_world", None)
            if check is not None:
                assert check(params, 4) is None, name


def test_every_strategy_declares_capabilities_the_others_can_read() -> None:
    from dmlctl.strategies.params import WITH_SERVERS, WORKERS_ONLY, Capabilities
    from dmlctl.ui.metric_columns import STRATEGY_COLUMNS

    for name in registry.names():
        caps = registry.capabilities(name)
        assert isinstance(caps, Capabilities), name
        assert caps.roles in (WORKERS_ONLY, WITH_SERVERS), name
        assert set(caps.columns) <= set(STRATEGY_COLUMNS), name  # each has a meaning
    assert [n for n in registry.names() if registry.capabilities(n).parallelism] == [
        "asgd",
        "ssgd",
    ]
    assert [n for n in registry.names() if registry.capabilities(n).fsdp] == ["ssgd"]
    assert not registry.needs_runtime("ssgd") and registry.needs_runtime("local-sgd")
