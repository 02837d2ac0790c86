"""The ``dmlctl`` command: one typer app, one error boundary.

Commands live one per module and only parse, call the library and render. This
module must stay cheap to import: no torch, no pydantic at import time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from dmlctl import __version__
from dmlctl.cli import (
    attach_cmd,
    bench,
    doctor_cmd,
    init_cmd,
    lab_cmd,
    launch_cmd,
    logs_cmd,
    plot_cmd,
    rm_cmd,
    status_cmd,
    stop_cmd,
    strategies_cmd,
)
from dmlctl.cli.closed_pipe import ForgivingStream
from dmlctl.cli.helptext import reflow_commands
from dmlctl.cli.library_logs import route_library_logs
from dmlctl.errors import DmlctlError, ExitCode
from dmlctl.runs.store import check_home

SSH_LOG = "ssh.log"
"""The SSH library's warnings and errors, in ``$DMLCTL_HOME`` (see
:mod:`dmlctl.cli.library_logs`)."""


def _ssh_log() -> Path:
    from dmlctl.runs.store import dmlctl_home  # only when a library logs something

    return dmlctl_home() / SSH_LOG


def _hide_flag_types() -> None:
    """No ``<bool>`` beside the flags in ``--help`` (typer ≥ 0.29 shows every option's
    type; a flag takes no value, so its type only misleads). Options that take a value
    keep theirs."""
    option = getattr(typer.core, "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if option is None or shown is None:
        return

    def display_type_rich(self: typer.core.TyperOption, ctx: object) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    option.display_type_rich = display_type_rich


_hide_flag_types()

app = typer.Typer(
    name="dmlctl",
    help="Run distributed PyTorch training on this machine or on hosts reachable over SSH.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"dmlctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """dmlctl: launch, watch and stop distributed training runs."""
    check_home()


for module in (
    init_cmd,
    launch_cmd,
    status_cmd,
    attach_cmd,
    logs_cmd,
    stop_cmd,
    rm_cmd,
    plot_cmd,
    doctor_cmd,
    strategies_cmd,
):
    module.register(app)
app.add_typer(bench.app, name="bench")
app.add_typer(lab_cmd.app, name="lab")
reflow_commands(app)


def _error(message: str) -> None:
    for line in message.splitlines() or [""]:
        print(f"dmlctl: {line}" if not line.startswith(" ") else line, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns (and, as a console script, exits with) the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None:  # the real command: a reader that goes away stops nothing
        sys.stdout = ForgivingStream(sys.stdout)
        sys.stderr = ForgivingStream(sys.stderr)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    route_library_logs(_ssh_log, debug=debug)
    try:
        rv = app(args=args, prog_name="dmlctl", standalone_mode=False)
    except DmlctlError as e:
        _error(str(e))
        code = int(e.exit_code)
    except typer.Exit as e:
        code = int(e.exit_code)
    except typer.Abort:
        print("dmlctl: aborted", file=sys.stderr)
        code = int(ExitCode.INTERRUPTED)
    except typer.TyperException as e:  # usage errors: typer prints usage and the problem
        show = getattr(e, "show", None)
        if callable(show):
            show()
        else:
            _error(e.format_message())
        code = int(ExitCode.BAD_INPUT)
    except KeyboardInterrupt:
        code = int(ExitCode.INTERRUPTED)
    except BrokenPipeError:  # bytes to a reader that had enough (`dmlctl logs RUN | head`)
        if isinstance(sys.stdout, ForgivingStream):
            sys.stdout.lose_reader()
        code = 0
    except Exception as e:
        if debug:
            raise
        print(
            f"dmlctl: internal error: {type(e).__name__}: {e} — rerun with --debug for details",
            file=sys.stderr,
        )
        code = int(ExitCode.INTERNAL)
    else:
        code = rv if isinstance(rv, int) else 0
    if argv is None:
        sys.exit(code)
    return code
