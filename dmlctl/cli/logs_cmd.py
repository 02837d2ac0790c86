"""``dmlctl logs RUN_ID [--rank N] [--follow]``."""

from __future__ import annotations

import sys
from typing import Optional

import typer


def logs(
    run_id: str = typer.Argument(..., help="A run id (or a unique prefix, or 'last')."),
    rank: Optional[int] = typer.Option(  # noqa: UP045 - typer needs Optional
        None, "--rank", "-r", help="Only this rank (default: every rank, merged)."
    ),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the run ends."),
    fetch: bool = typer.Option(
        False, "--fetch", help="Copy the rank files kept on each host again, and print those."
    ),
    stacks: bool = typer.Option(
        False, "--stacks", help="Print the Python stacks of every thread, dumped on a hang."
    ),
    raw: bool = typer.Option(
        False,
        "--raw",
        help="The bytes as the ranks wrote them, also on a terminal "
        "(by default a terminal gets control characters escaped).",
    ),
) -> int:
    """Print a run's logs from its run directory (or, with --fetch, from the hosts).

    On a terminal every line is shown as the live view shows it: colours dropped,
    other control characters escaped. Piped, or with --raw, the bytes are copied."""
    from dmlctl.errors import UsageError
    from dmlctl.runs.logs import print_host_files, print_stacks, stream_log
    from dmlctl.runs.store import RunStore

    if stacks and (fetch or follow):
        raise UsageError("--stacks goes with neither --fetch nor --follow")
    run = RunStore().get(run_id)
    escape = not raw and sys.stdout.isatty()
    if stacks:
        print_stacks(run, rank)
        return 0
    if fetch:
        if follow:
            raise UsageError("--fetch and --follow do not go together")
        from dmlctl.launch.pick import scheduler_of

        for problem in scheduler_of(run).logs(run):
            print(f"dmlctl: could not fetch from {problem}", file=sys.stderr)
        print_host_files(run, rank, escape=escape)
        return 0
    copied = stream_log(run, rank, follow=follow, escape=escape)
    if not copied:
        who = f"rank {rank}" if rank is not None else "no rank"
        print(f"dmlctl: {who} of run {run.run_id} wrote nothing", file=sys.stderr)
    return 0


def register(app: typer.Typer) -> None:
    app.command()(logs)
