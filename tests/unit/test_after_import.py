"""The runtime's post-import hook: a function runs right after a module's own code,
whoever imports it, and the module is not imported for it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _run(code: str, where: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_function_runs_after_the_modules_code_and_only_once(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("VALUE = 41\ndef f():\n    return VALUE\n")
    out = _run(
        """
        import inspect, sys
        sys.path.insert(0, ".")
        from dmlctl.runtime.after_import import after_import
        seen = []
        after_import("pkg.mod", lambda m: seen.append(m.VALUE))
        print("imported before:", "pkg.mod" in sys.modules)
        import pkg.mod
        import pkg.mod  # a second import runs nothing again
        print("seen:", seen)
        print("source:", inspect.getsource(pkg.mod.f).splitlines()[0])
        print("finder left:", any(type(f).__name__ == "_Finder" for f in sys.meta_path))
        after_import("pkg.mod", lambda m: print("already:", m.VALUE))
        """,
        tmp_path,
    )
    assert out.splitlines() == [
        "imported before: False",
        "seen: [41]",
        "source: def f():",
        "finder left: False",
        "already: 41",
    ]


def test_the_optimizer_guard_waits_for_the_scripts_own_import_of_torch(tmp_path: Path) -> None:
    out = _run(
        """
        import sys
        from dmlctl.runtime import guards
        guards.install("local-sgd", needs_runtime=True)
        print("torch before the script:", "torch" in sys.modules)
        import torch
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        try:
            opt.step()
        except guards.StrategyNotApplied as exc:
            print("refused:", "local-sgd" in str(exc))
        """,
        tmp_path,
    )
    assert out.splitlines() == ["torch before the script: False", "refused: True"]
