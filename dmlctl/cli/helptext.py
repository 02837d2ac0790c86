"""Help texts that wrap to the terminal: a command's docstring is written with line
breaks at the source's width, which the help screen would keep (ragged lines at 80
columns); :func:`reflow_commands` joins the lines of each paragraph so the help
screen wraps them itself."""

from __future__ import annotations

import inspect

import typer


def reflow(text: str) -> str:
    """``text`` with the lines of each paragraph (blank-line separated) joined by
    spaces; a paragraph whose lines after the first are indented (an example, a
    list) keeps its line breaks."""
    out = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines = paragraph.splitlines()
        if any(line.startswith(" ") for line in lines[1:]) or paragraph.startswith("\b"):
            out.append(paragraph)
        else:
            out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def reflow_commands(app: typer.Typer) -> None:
    """Reflow the help of every command of ``app`` and of its sub-apps (in place)."""
    for command in app.registered_commands:
        doc = command.help or (command.callback.__doc__ if command.callback else None)
        if doc:
            command.help = reflow(doc)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            reflow_commands(group.typer_instance)
