"""dmlctl extends torch where torch invites it and never patches it: no assignment to
(or deletion of) an attribute of a torch module, class or function anywhere in
``dmlctl/``, directly or through ``setattr``/``delattr``.

The check follows names bound by imports (``import torch.x as y``, ``from torch.x
import Y``) and attribute chains on them (``torch.cuda.is_available = …``). An
attribute of an object torch made (``self._remaining_restarts`` in a subclass of
torch's agent) is that object's state, not torch's.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dmlctl"


def _torch_names(tree: ast.AST) -> set[str]:
    """The names a module binds to a torch module, class or function."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or alias.name.startswith("torch."):
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _root(node: ast.expr) -> str | None:
    """The name at the root of an attribute chain (``a`` of ``a.b.c``)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def patches(source: str, filename: str = "<source>") -> list[str]:
    """Every assignment to a torch attribute in ``source``: ``file:line: code``."""
    tree = ast.parse(source, filename)
    torch = _torch_names(tree)
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
        ):
            targets = [ast.Attribute(value=node.args[0], attr="?", ctx=ast.Store())]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and _root(part) in torch:
                    found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
                    break
    return found


def test_the_check_finds_every_form_of_a_patch() -> None:
    source = """
import torch
import torch.distributed.elastic.agent.server.api as api
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler
from torch.distributed.elastic.rendezvous import api as rdzv
torch.cuda.is_available = lambda: False
api.SimpleElasticAgent._exit_barrier = None
SubprocessHandler._popen = None
setattr(rdzv.RendezvousStoreInfo, "build", None)
delattr(torch.cuda, "device_count")
del torch.cuda.x
torch.x += 1
"""
    assert len(patches(source)) == 7
    assert patches("import torch\nself.x = torch.zeros(1)\nclass A:\n    y = torch.ones\n") == []


def test_no_module_of_dmlctl_patches_torch() -> None:
    found = [
        line
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in patches(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    ]
    assert found == []
