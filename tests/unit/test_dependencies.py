"""Declared dependencies match the code: every third-party import in ``dmlctl/`` comes
from a distribution ``pyproject.toml`` declares, and every declared runtime requirement
is imported somewhere. Read from the installed metadata, so a stale editable install
(pyproject changed, not re-installed) fails too.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import sys
from collections import defaultdict
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "dmlctl"


def third_party_imports() -> dict[str, set[str]]:
    """Top-level module → the files importing it, for every import statement at any
    depth (function-level ones run too); relative, dmlctl's own and stdlib imports
    left out, and so are script-style imports of a sibling file (``import workload``
    next to ``workload.py``)."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                sibling = (path.parent / f"{top}.py").is_file() or (path.parent / top).is_dir()
                if top != "dmlctl" and top not in sys.stdlib_module_names and not sibling:
                    found[top].add(str(path.relative_to(PACKAGE_DIR.parent)))
    return found


OPTIONAL_EXTRAS = ("bench", "plot")
"""Extras of optional features (``dmlctl bench accuracy`` needs scikit-learn,
``dmlctl plot`` matplotlib)."""


def declared(extra: str | None = None) -> set[str]:
    """Canonical names of dmlctl's runtime requirements (no ``extra ==`` entries), or
    of the requirements of ``extra``."""
    reqs = [Requirement(line) for line in md.requires("dmlctl") or []]
    if extra is None:
        return {canonicalize_name(r.name) for r in reqs if "extra" not in str(r.marker or "")}
    wanted = f'extra == "{extra}"'
    return {canonicalize_name(r.name) for r in reqs if wanted in str(r.marker or "")}


def imported_distributions() -> dict[str, set[str]]:
    """Canonical distribution name → the files importing one of its modules."""
    providers = md.packages_distributions()
    out: dict[str, set[str]] = defaultdict(set)
    for module, files in third_party_imports().items():
        assert module in providers, f"{module} (imported by {sorted(files)}) is not installed"
        names = {canonicalize_name(d) for d in providers[module]}
        # A module several distributions provide counts for the declared one, if any.
        for name in sorted(names & declared()) or sorted(names)[:1]:
            out[name] |= files
    return out


def test_the_scan_sees_lazy_and_module_level_imports() -> None:
    found = third_party_imports()
    assert "torch" in found and "pydantic" in found and "typer" in found
    assert "dmlctl/cli/app.py" in found["typer"]
    assert "workload" not in found  # the bench scripts' sibling module


def test_every_import_comes_from_a_declared_distribution() -> None:
    allowed = declared().union(*(declared(extra) for extra in OPTIONAL_EXTRAS))
    missing = {d: sorted(f) for d, f in imported_distributions().items() if d not in allowed}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_every_declared_requirement_is_imported() -> None:
    stale = declared() - set(imported_distributions())
    assert not stale, f"declared in pyproject.toml but never imported by dmlctl/: {sorted(stale)}"


def test_the_quick_start_installs_what_running_needs_and_no_dev_tool(tmp_path: Path) -> None:
    """``make quickstart`` on a fresh clone (``make -n``: what it would run, into a fresh
    virtualenv) installs dmlctl and torch, not the dev extras ``make test`` adds."""
    import subprocess

    repo = PACKAGE_DIR.parent
    venv = tmp_path / "venv"

    def planned(target: str, *more: str) -> str:
        argv = ["make", "-n", "-B", "-C", str(repo), target, f"VENV={venv}", *more]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    quick = [line for line in planned("quickstart").splitlines() if "pip install" in line]
    assert len(quick) == 1 and quick[0].endswith("torch==2.13.0 -e ."), quick
    assert "dmlctl launch examples/quickstart/job.yaml" in planned("quickstart")
    assert "-e '.[dev]'" in planned("test")
    # A part chosen by mark runs once: the serial part's own -m would be overridden by it
    # (it ran every selected test a second time, one at a time).
    marked = 'PYTEST_ARGS=-m "not integration and not ssh"'
    assert "-m serial" in planned("test") and "-m serial" not in planned("test", marked)
