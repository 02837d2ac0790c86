"""What a field means, read from its attribute docstring (``dmlctl.spec.field_docs``)."""

from __future__ import annotations

import importlib
import inspect
from typing import ClassVar

from pydantic import BaseModel, Field

from dmlctl.spec.field_docs import field_docs
from dmlctl.strategies import registry

SPEC_MODULES = (
    "dmlctl.spec.models",
    "dmlctl.spec.cluster",
    "dmlctl.spec.restart",
    "dmlctl.spec.slurm",
    "dmlctl.spec.parallelism",
    "dmlctl.strategies.params",
)


def _models() -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = [registry.load(name).Params for name in registry.names()]
    for name in SPEC_MODULES:
        module = importlib.import_module(name)
        found += [
            v
            for v in vars(module).values()
            if inspect.isclass(v) and issubclass(v, BaseModel) and v.__module__ == name
        ]
    return found


def test_every_field_of_every_spec_model_and_strategy_says_what_it_means() -> None:
    models = _models()
    assert len(models) > 25
    for model in models:
        docs = field_docs(model)
        missing = set(model.model_fields) - set(docs)
        assert not missing, f"{model.__module__}.{model.__qualname__}: {sorted(missing)}"
        assert all(text and "\n" not in text and "  " not in text for text in docs.values())


class _Base(BaseModel):
    inherited: int = 1
    """From the base,
    over two lines."""


class _Model(_Base):
    plain: int = 2
    """Plain."""
    described: int = Field(default=3, description="Given to Field.")
    bare: int = 4
    not_a_field: ClassVar[str] = "x"
    """A docstring of no field."""


def test_docstrings_of_bases_and_field_descriptions_are_read_and_a_bare_field_has_none() -> None:
    assert field_docs(_Model) == {
        "inherited": "From the base, over two lines.",
        "plain": "Plain.",
        "described": "Given to Field.",
    }
