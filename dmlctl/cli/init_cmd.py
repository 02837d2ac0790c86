"""``dmlctl init [DIR]``."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from dmlctl.cli.common import stdout_console


def init(
    directory: Path = typer.Argument(
        Path("."), help="Project directory to create or fill (default: this one)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> int:
    """Write a cluster spec, a job file and a small train.py that launch as-is."""
    from dmlctl.scaffold import write_project

    written = write_project(directory, force=force)
    console = stdout_console()
    for path in written:
        console.print(f"wrote {path}", markup=False)
    here = directory.resolve() == Path.cwd().resolve()
    go = "" if here else f"cd {shlex.quote(str(directory))} && "
    console.print(f"\nnext:\n  {go}dmlctl launch job.yaml", markup=False)
    return 0


def register(app: typer.Typer) -> None:
    app.command()(init)
