"""``dmlctl doctor [--cluster FILE] [--connect-timeout S] [--accept-new-host-keys]
[--port N] [--json]``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from dmlctl.cli.common import check_connect_timeout, stderr_console, stdout_console
from dmlctl.text import plural

if TYPE_CHECKING:
    from dmlctl.provision.doctor import DoctorReport

DEFAULT_PORT = 29500
"""torchrun's default rendezvous port: checked when --port is not given."""


def doctor(
    cluster: Optional[Path] = typer.Option(  # noqa: UP045 - typer needs Optional
        None, "--cluster", "-c", help="Cluster spec; default: this machine."
    ),
    connect_timeout: float = typer.Option(
        10.0, "--connect-timeout", help="Seconds to wait for each SSH connection."
    ),
    accept_new_host_keys: bool = typer.Option(
        False,
        "--accept-new-host-keys",
        help="Trust (and record) host keys seen for the first time.",
    ),
    port: int = typer.Option(
        DEFAULT_PORT, "--port", min=1, max=65535, help="Rendezvous port to check on the first host."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> int:
    """Check every host before a launch (exit 0 only if every host is ready); on a
    Slurm cluster, every node of a short allocation of its request."""
    import sys

    from dmlctl.plan.placing import as_run
    from dmlctl.provision.doctor import run_doctor
    from dmlctl.spec import default_cluster, load_cluster_file
    from dmlctl.transport import close_transports, make_transports

    check_connect_timeout(connect_timeout)
    spec = load_cluster_file(cluster) if cluster is not None else default_cluster()
    err = stderr_console()
    if spec.scheduler == "slurm":
        from dmlctl.errors import PlanError
        from dmlctl.launch.slurm_doctor import doctor_on_slurm
        from dmlctl.spec.locate import locate

        try:
            return _shown(doctor_on_slurm(spec, port, err), as_json)
        except PlanError as e:
            raise locate(e, None, str(cluster)) from None
    # Local hosts run with this interpreter at launch time, so that is the one to check.
    hosts = [as_run(h, sys.executable) for h in spec.resolved_hosts()]
    options = None
    if not all(h.is_local for h in hosts):
        from dmlctl.transport.ssh import SshOptions

        def shown(name: str, key_type: str, fp: str) -> None:
            err.print(f"added host key of {name} to known_hosts: {key_type} {fp}", markup=False)

        options = SshOptions(connect_timeout, accept_new_host_keys, on_new_key=shown)
    transports = make_transports(hosts, options)
    try:
        with err.status(f"checking {plural(len(hosts), 'host')}…"):
            report = run_doctor(hosts, transports, rdzv_port=port)
    finally:
        close_transports(transports)
    return _shown(report, as_json)


def _shown(report: DoctorReport, as_json: bool) -> int:
    """Print ``report`` (as JSON with ``as_json``); the exit code: 0 when all is ready."""
    from dmlctl.provision.doctor_view import doctor_json, render_doctor

    if as_json:
        print(json.dumps(doctor_json(report), indent=1))
    else:
        stdout_console().print(render_doctor(report))
    return 0 if report.ok else 1


def register(app: typer.Typer) -> None:
    app.command()(doctor)
