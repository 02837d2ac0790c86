"""``dmlctl strategies [NAME]``: the registered strategies and their parameters."""

from __future__ import annotations

from typing import Optional

import typer

from dmlctl.cli.common import stdout_console


def strategies(
    name: Optional[str] = typer.Argument(  # noqa: UP045 - typer needs Optional
        None, help="Show one strategy's parameters (default: list every strategy)."
    ),
) -> int:
    """List the training strategies a job's 'strategy:' may name, or one's parameters."""
    from rich.table import Table

    from dmlctl.errors import UsageError
    from dmlctl.spec.models import uses_servers
    from dmlctl.strategies import registry
    from dmlctl.strategies.params import default_text, range_text, type_name

    console = stdout_console()
    if name is None:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in ("strategy", "parameter servers", "what it does"):
            table.add_column(column)
        for strategy in registry.names():
            servers = "required" if uses_servers(strategy) else "-"
            table.add_row(strategy, servers, registry.entry(strategy).summary)
        console.print(table)
        return 0
    try:
        entry = registry.entry(name)
    except registry.UnknownStrategy as exc:
        raise UsageError(str(exc)) from None
    console.print(f"{entry.name}: {entry.summary}", markup=False)
    if uses_servers(name):
        console.print("needs 'parameter_servers: N' (N >= 1) in the job", markup=False)
    params = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("param", "type", "default", "range", "meaning"):
        params.add_column(column)
    module = registry.load(name)
    fields = module.Params.model_fields.items()
    for key, field in sorted(fields, key=lambda item: item[0] == "final"):  # final: last
        params.add_row(
            key,
            type_name(field.annotation),
            default_text(field),
            range_text(field),
            field.description or "",
        )
    console.print(params)
    console.print(f"quality: {module.QUALITY}", markup=False, soft_wrap=False)
    return 0


def register(app: typer.Typer) -> None:
    app.command()(strategies)
