"""``dmlctl init DIR``."""

from __future__ import annotations

from pathlib import Path

import typer

from dmlctl.cli.common import stdout_console


def init(
    directory: Path = typer.Argument(..., help="Project directory to create or fill."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> int:
    """Write a cluster spec, a job file and a small train.py that launch as-is."""
    from dmlctl.scaffold import write_project

    written = write_project(directory, force=force)
    console = stdout_console()
    for path in written:
        console.print(f"wrote {path}", markup=False)
    console.print(f"\nnext:\n  cd {directory} && dmlctl launch job.yaml", markup=False)
    return 0


def register(app: typer.Typer) -> None:
    app.command()(init)
