"""Run a function once a module has been imported, without importing it.

A fresh rank must import torch itself, in its script, as under torchrun: a variable
the script sets before ``import torch`` (``OMP_NUM_THREADS``) then counts. What the
runtime entry arms on torch before the script runs waits for that import instead of
making it (:func:`after_import`).

This uses Python's import system where it invites extension: a finder placed first on
``sys.meta_path``. It finds nothing itself. For the one module it waits for, it asks
the other finders, and wraps the loader they return, so that the function runs right
after the module's code has run. Every other attribute of the loader is the wrapped
loader's (``get_source``, ``get_filename``, …), so tracebacks and ``inspect`` see the
module's own source. The finder leaves ``sys.meta_path`` at its first use.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

Then = Callable[[ModuleType], None]


def after_import(name: str, then: Then) -> None:
    """Call ``then(module)`` once the module ``name`` has been imported: now if it
    has been, else right after its code has run, whoever imports it."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return
    sys.meta_path.insert(0, _Finder(name, then))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``name`` through the finders after it, its loader wrapped."""

    def __init__(self, name: str, then: Then) -> None:
        self._name = name
        self._then = then

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname != self._name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = _find(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # nothing to wrap: found by no one, or an old-style loader
        spec.loader = _Loader(spec.loader, self._then)
        return spec


def _find(
    fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> ModuleSpec | None:
    """The spec the finders on ``sys.meta_path`` give for ``fullname``."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec: ModuleSpec | None = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


class _Loader(importlib.abc.Loader):
    """The module's own loader, then ``then``."""

    def __init__(self, loader: Any, then: Then) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
