"""``dmlctl strategies [NAME]``: the registered strategies and their parameters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from dmlctl.cli.common import stdout_console

if TYPE_CHECKING:
    from rich.console import RenderableType


def strategies(
    name: Optional[str] = typer.Argument(  # noqa: UP045 - typer needs Optional
        None, help="Show one strategy's parameters (default: list every strategy)."
    ),
) -> int:
    """List the training strategies a job's 'strategy:' may name, or one's parameters."""
    from rich.table import Table

    from dmlctl.errors import UsageError
    from dmlctl.spec.field_docs import field_docs
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
    module = registry.load(name)
    fields = module.Params.model_fields.items()
    docs = field_docs(module.Params)
    rows = [
        (
            key,
            type_name(field.annotation),
            default_text(field),
            range_text(field),
            docs.get(key, ""),
        )
        for key, field in sorted(fields, key=lambda item: item[0] == "final")  # final: last
    ]
    console.print(_params_view(rows, console.width))
    console.print(_columns_view(registry.columns(name)))
    console.print(f"quality: {module.QUALITY}", markup=False, soft_wrap=False)
    return 0


MEANING_MIN = 40
"""The narrowest the meaning column may be; a narrower terminal gets one block per
parameter (its facts on one line, the meaning under it at full width)."""


def _params_view(rows: list[tuple[str, str, str, str, str]], width: int) -> RenderableType:
    """The parameters of a strategy: a table with a meaning column of at least
    :data:`MEANING_MIN` characters, or blocks where the terminal is narrower."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    heads = ("param", "type", "default", "range")
    facts = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(heads)]
    if width - sum(facts) - 2 * len(facts) >= MEANING_MIN:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in (*heads, "meaning"):
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        return table
    blocks: list[RenderableType] = []
    for key, kind, default, bounds, meaning in rows:
        head = Text.assemble((key, "bold"), f"  {kind}  default {default}")
        head.append(f"  ({bounds})" if bounds else "")
        blocks += [head, Padding(Text(meaning), (0, 0, 0, 4))]
    return Group(*blocks)


def _columns_view(keys: tuple[str, ...]) -> RenderableType:
    """What the dashboard shows for this strategy's runs besides the columns every
    run has, one line per column with its meaning."""
    from rich.text import Text

    from dmlctl.ui.metric_columns import STRATEGY_COLUMNS

    text = Text("dashboard: comm/step and comm % (run average, recent window in parentheses)")
    for key in keys:
        column = STRATEGY_COLUMNS[key]
        text.append(f"\n  {column.header}: {column.meaning}")
    return text


def register(app: typer.Typer) -> None:
    app.command()(strategies)
