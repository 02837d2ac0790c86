"""The import layers of ``dmlctl/`` (see the design's "Where things live"): no import
cycle between modules, imports point down the layers, and the control plane and the
data plane meet only in torch-free modules. And every function fits on a screen
(60 lines, or a ``# long: <reason>`` beside its ``def``).

Every import counts, module-level or inside a function (a lazy import is still a
dependency); only imports under ``if TYPE_CHECKING:`` are left out.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "dmlctl"

#: Control-plane packages, lowest first: a module may import its own package and
#: those listed before it, never one after it.
CONTROL = (
    "spec",
    "transport",
    "slurm",
    "plan",
    "runs",
    "ui",
    "provision",
    "hangs",
    "launch",
    "lab",
    "cli",
)
#: Above both planes: benchmarks drive launches and run their own rank-side jobs;
#: only the CLI imports them.
TOP = "bench"
#: Data-plane packages, lowest first (the same rule).
DATA = ("runtime", "ps", "strategies", "agent", "integrations")
#: Modules that compose the data plane (a rank's entry and ``dmlctl.init()``): they
#: may import any data-plane package.
COMPOSERS = {"dmlctl.runtime.entry", "dmlctl.runtime.session", "dmlctl"}
#: Shared base modules every layer may import (torch-free, no dmlctl imports above).
BASE = {
    "dmlctl.errors",
    "dmlctl.failure",
    "dmlctl.wire",
    "dmlctl.agent_config",
    "dmlctl.protocol",
    "dmlctl.torchrun_report",
    "dmlctl.mesh",
    "dmlctl.gpus",
    "dmlctl.redact",
    "dmlctl.masking",
    "dmlctl.private_files",
    "dmlctl.checkpoint_files",
    "dmlctl.checkpoint_claim",
    "dmlctl.run_key",
    "dmlctl.startup_env",
    "dmlctl.text",
    "dmlctl.scaffold",
    "dmlctl.__main__",
    "dmlctl.templates.train",
}
#: Where the control plane may reach into the data plane: torch-free modules only.
MEETING = re.compile(
    r"^dmlctl\.(strategies\.registry|strategies\.params|strategies\.[a-z_]+\.params|agent\.(procs|ask))$"
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str, path: Path) -> Iterator[str]:
    """The dmlctl modules ``name`` imports, outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        for target in targets:
            resolved = _resolve(target) if target.startswith("dmlctl") else None
            if resolved is not None and resolved != name:
                yield resolved


EDGES = {name: set(_imports(name, path)) for name, path in MODULES.items()}


def _area(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and f"{name}" not in BASE) else ""


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in EDGES[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return found


def _problem(src: str, dst: str) -> str | None:
    """Why the import ``src`` → ``dst`` breaks the layering, or None."""
    a, b = _area(src), _area(dst)
    if dst in BASE or a == b:
        return None
    if b == TOP:
        return None if a == "cli" else f"{a} imports the benchmarks"
    if a == TOP:
        return None if b != "cli" else "the benchmarks import the CLI"
    if src == "dmlctl" or dst == "dmlctl":  # the package: version and init()
        return None if dst == "dmlctl" or dst.startswith("dmlctl.runtime") else "root"
    if a in CONTROL and b in CONTROL and CONTROL.index(b) > CONTROL.index(a):
        return f"upward import ({a} is below {b})"
    if a in DATA and b in DATA and DATA.index(b) > DATA.index(a) and src not in COMPOSERS:
        return f"upward import ({a} is below {b})"
    if a in DATA and b in CONTROL:
        return "the data plane imports the control plane"
    if a in CONTROL and b in DATA and not MEETING.match(dst):
        return "the control plane imports a data-plane module that is not a meeting point"
    return None


def test_no_import_cycle() -> None:
    assert _cycles() == []


def test_imports_point_down_the_layers() -> None:
    bad = sorted(
        f"{src} -> {dst}: {why}"
        for src, targets in EDGES.items()
        for dst in targets
        if (why := _problem(src, dst)) is not None
    )
    assert bad == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if MEETING.match(m)))
def test_meeting_points_do_not_import_torch(module: str) -> None:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] == "torch"]
    assert not [d for d in EDGES[module] if _area(d) in DATA and not MEETING.match(d)]


def test_every_package_has_a_layer() -> None:
    areas = {_area(m) for m in MODULES} - {""}
    assert areas <= {*CONTROL, *DATA, TOP, "templates"}


MAX_FUNCTION_LINES = 60
#: Marker for a longer function: ``# long: <one-line reason>`` on its ``def`` line.
LONG_REASON = re.compile(r"#\s*long:\s*\S")


def test_functions_fit_on_a_screen() -> None:
    too_long = []
    for name, path in sorted(MODULES.items()):
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES and not LONG_REASON.search(lines[node.lineno - 1]):
                too_long.append(f"{name}.{node.name} ({length} lines)")
    assert too_long == []
