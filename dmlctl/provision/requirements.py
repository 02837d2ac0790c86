"""What every host must be able to import: the third-party distributions of the data
plane, derived from the code and the package metadata, never kept by hand.

:func:`data_plane_requirements` promises:

* it follows dmlctl's own imports from the modules a host process runs — the package
  ``dmlctl`` (what training scripts import), ``dmlctl.runtime``, the rank entry
  ``dmlctl.runtime.entry``, the host agent ``dmlctl.agent.__main__`` and every
  strategy module in the registry — through module-level *and* function-level
  imports (lazy imports run too), parent packages included; imports under
  ``if TYPE_CHECKING:`` never run and are not followed;
* every import that is neither dmlctl, nor relative, nor the standard library is a
  requirement: its top-level module is mapped to the distribution that installs it
  (``importlib.metadata.packages_distributions``) and that distribution to the range
  dmlctl declares for it (``importlib.metadata.requires("dmlctl")``, extras left out);
* without dmlctl's distribution metadata (e.g. run from a bare source tree) the same
  modules are required with no version bound; a module no installed distribution
  provides is its own distribution name;
* it never imports torch or any module it inspects (except the strategy registry,
  which is torch-free) and is computed once per process.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

PACKAGE = "dmlctl"
SOURCE_ROOT = Path(__file__).resolve().parents[2]
"""The directory that holds the ``dmlctl`` package."""
DATA_PLANE_ENTRIES = ("dmlctl", "dmlctl.runtime", "dmlctl.runtime.entry", "dmlctl.agent.__main__")
"""What a host process starts from (strategy modules come from the registry)."""


@dataclass(frozen=True)
class Needed:
    """One distribution the hosts need: its name as installed here (or as declared),
    the top-level modules the data plane imports from it, and the declared range
    (empty: any version)."""

    dist: str
    modules: tuple[str, ...]
    specifier: SpecifierSet

    @property
    def name(self) -> str:
        """The canonical (PEP 503) distribution name, e.g. ``pyyaml``."""
        return canonicalize_name(self.dist)

    @property
    def range(self) -> str:
        """The declared range, lower bounds first (``>=2.5,<3``); ``""`` for any."""
        specs = sorted(self.specifier, key=lambda s: (s.operator[0] == "<", str(s)))
        return ",".join(str(s) for s in specs)

    def allows(self, version: str) -> bool:
        """``version`` is in the declared range (pre-releases and local builds such as
        ``2.13.0+cpu`` count); a version that is not PEP 440 is given the benefit of
        the doubt, since the module imported."""
        try:
            return self.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return True


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth (not under TYPE_CHECKING)."""
    if isinstance(tree, ast.If) and _is_type_checking(tree.test):
        for node in tree.orelse:
            yield from _imports(node)
        return
    if isinstance(tree, (ast.Import, ast.ImportFrom)):
        yield tree
    for child in ast.iter_child_nodes(tree):
        yield from _imports(child)


def _source(module: str, root: Path) -> Path | None:
    """The file of ``module`` under ``root`` (a package's ``__init__.py``), or None."""
    base = root.joinpath(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _imported_by(module: str, path: Path) -> Iterator[str]:
    """Absolute names of what ``module`` (at ``path``) imports, relative ones resolved;
    for ``from X import a`` both ``X`` and ``X.a`` (which may be a submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        yield base
        yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def import_closure(entries: Iterable[str], root: Path = SOURCE_ROOT) -> frozenset[str]:
    """Top-level third-party modules imported, directly or through dmlctl's own
    modules (found under ``root``), by ``entries`` (dmlctl module names); see the
    module promises."""
    todo = [m for e in entries for m in _with_parents(e)]
    seen: set[str] = set()
    third_party: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _source(module, root)
        if path is None:
            continue
        for name in _imported_by(module, path):
            top = name.partition(".")[0]
            if top == PACKAGE:
                todo.extend(m for m in _with_parents(name) if m not in seen)
            elif top and top not in sys.stdlib_module_names:
                third_party.add(top)
    return frozenset(third_party)


def declared_requirements(dist: str = PACKAGE) -> dict[str, Requirement] | None:
    """``dist``'s runtime requirements by canonical name (extras and requirements whose
    marker is false here left out), or None without ``dist``'s metadata."""
    try:
        lines = md.requires(dist) or []
    except md.PackageNotFoundError:
        return None
    reqs = (Requirement(line) for line in lines)
    return {
        canonicalize_name(r.name): r
        for r in reqs
        if r.marker is None or r.marker.evaluate({"extra": ""})
    }


def needed_for(
    modules: Iterable[str],
    declared: Mapping[str, Requirement] | None,
    providers: Mapping[str, list[str]],
) -> tuple[Needed, ...]:
    """Group top-level ``modules`` by the distribution ``providers`` (module → the
    distributions installing it) names, preferring a declared one, each with its
    declared range; sorted by distribution name."""
    declared = declared or {}
    grouped: dict[str, tuple[str, list[str]]] = {}
    for module in sorted(set(modules)):
        dists = providers.get(module) or [module]
        dist = next((d for d in dists if canonicalize_name(d) in declared), dists[0])
        grouped.setdefault(canonicalize_name(dist), (dist, []))[1].append(module)
    out = []
    for name, (dist, mods) in sorted(grouped.items()):
        req = declared.get(name)
        out.append(Needed(dist, tuple(mods), req.specifier if req else SpecifierSet()))
    return tuple(out)


def strategy_modules() -> tuple[str, ...]:
    """Every registered strategy's module name (the registry is torch-free)."""
    from dmlctl.strategies import registry

    return tuple(registry.entry(name).module for name in registry.names())


@functools.cache
def data_plane_requirements() -> tuple[Needed, ...]:
    """What every host must import, sorted by distribution (see the module promises)."""
    modules = import_closure((*DATA_PLANE_ENTRIES, *strategy_modules()))
    return needed_for(modules, declared_requirements(), md.packages_distributions())
