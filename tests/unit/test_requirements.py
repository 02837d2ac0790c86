"""What the hosts must import: derived from the code (import closure of the data plane)
and the declared ranges, and said the same way in the README and the cluster template."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from dmlctl.provision.requirements import (
    Needed,
    data_plane_requirements,
    declared_requirements,
    import_closure,
    needed_for,
)

REPO = Path(__file__).resolve().parents[2]


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_closure_follows_lazy_relative_and_parent_imports(tmp_path: Path) -> None:
    root = write(
        tmp_path,
        {
            "dmlctl/__init__.py": "import json\ndef init():\n    from dmlctl.run import go\n",
            "dmlctl/run/__init__.py": "from . import helper\n",
            "dmlctl/run/helper.py": "from ..deep.mod import x\nimport numpy.linalg\n",
            "dmlctl/deep/__init__.py": "import yaml\n",
            "dmlctl/deep/mod.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    import typer\nelse:\n    import rich\n"
                "def f():\n    import torch.distributed\n"
            ),
            "dmlctl/cli.py": "import fabric\n",  # never imported from the entry: not needed
        },
    )
    assert import_closure(["dmlctl"], root) == {"numpy", "yaml", "rich", "torch"}
    # A submodule runs its parent package first.
    assert import_closure(["dmlctl.cli"], root) == {"fabric", "numpy", "yaml", "rich", "torch"}


def test_needed_groups_modules_by_distribution_with_the_declared_range() -> None:
    declared = {"pyyaml": Requirement("PyYAML>=6"), "pydantic": Requirement("pydantic<3,>=2.5")}
    providers = {"yaml": ["PyYAML"], "pydantic": ["pydantic"], "_yaml": ["PyYAML"]}
    got = needed_for(["pydantic", "yaml", "_yaml", "mystery"], declared, providers)
    assert got == (
        Needed("mystery", ("mystery",), SpecifierSet()),  # not installed here: its own name
        Needed("pydantic", ("pydantic",), SpecifierSet(">=2.5,<3")),
        Needed("PyYAML", ("_yaml", "yaml"), SpecifierSet(">=6")),
    )
    assert got[1].range == ">=2.5,<3" and got[0].range == ""
    # Without dmlctl's metadata every module is still needed, in any version.
    assert all(not n.specifier for n in needed_for(["yaml"], None, providers))
    assert declared_requirements("dmlctl-surely-not-installed") is None


def test_allows() -> None:
    pydantic = Needed("pydantic", ("pydantic",), SpecifierSet("<3,>=2.5"))
    assert pydantic.allows("2.14.3") and pydantic.allows("2.6.0rc1")
    assert not pydantic.allows("1.10.2") and not pydantic.allows("3.0.0")
    torch = Needed("torch", ("torch",), SpecifierSet(">=2.4"))
    assert torch.allows("2.13.0+cpu") and torch.allows("2.14.0.dev20260101+cu128")
    assert not torch.allows("2.3.1+cu121")
    assert torch.allows("not a version")  # it imported; nothing to compare


def test_the_data_plane_needs_torch_and_never_the_control_plane() -> None:
    needed = data_plane_requirements()
    names = {n.name for n in needed}
    assert {"torch", "pydantic", "numpy"} <= names
    assert not names & {"typer", "rich", "fabric", "paramiko", "pathspec", "packaging"}
    assert data_plane_requirements() is needed  # computed once
    declared = declared_requirements()
    assert declared is not None
    for n in needed:  # every range is the declared one
        assert n.specifier == declared[n.name].specifier


def test_readme_and_cluster_template_name_exactly_what_the_hosts_need() -> None:
    needed = {n.name: str(n.specifier) for n in data_plane_requirements()}
    readme = (REPO / "README.md").read_text()
    sentence = re.search(r"What a remote host needs:(.*?)(?<![\d.])\.\s", readme, re.S)
    assert sentence, "README: the 'What a remote host needs:' sentence is gone"
    said = [Requirement(r) for r in re.findall(r"`([^`]+)`", sentence.group(1))]
    assert {canonicalize_name(r.name): str(r.specifier) for r in said} == needed
    bullet = re.search(r"every package the ranks import \(([^)]*)\)", readme)
    assert bullet, "README: the preflight bullet no longer lists the packages"
    listed = re.findall(r"`([^`]+)`", bullet.group(1))
    assert {canonicalize_name(n) for n in listed} == set(needed)
    template = (REPO / "dmlctl" / "templates" / "cluster.yaml").read_text()
    line = re.search(r"python:.*it needs (.*)", template)
    assert line, "cluster template: the python line no longer says what a host needs"
    assert {canonicalize_name(n.strip()) for n in line.group(1).split(",")} == set(needed)
