"""``dmlctl launch``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from dmlctl.cli.common import CLUSTER_OPTION, check_connect_timeout, stderr_console, stdout_console

if TYPE_CHECKING:
    from dmlctl.spec import ClusterSpec, JobSpec

UI_MODES = ("auto", "live", "plain", "quiet")


DETACH_HELP = "Run in the background and print its id; dmlctl attach ID shows the live view."


def launch(
    job_file: Optional[Path] = typer.Argument(  # noqa: UP045 - typer needs Optional
        None, help="The job file (job.yaml).", show_default=False
    ),
    resume: Optional[str] = typer.Option(  # noqa: UP045
        None, "--resume", help="Continue RUN, whose controller died, from its checkpoints."
    ),
    cluster: Optional[Path] = CLUSTER_OPTION,  # noqa: UP045 - typer needs Optional
    workers: Optional[int] = typer.Option(  # noqa: UP045
        None, "--workers", "-n", help="Number of workers (overrides the job file)."
    ),
    ranks: Optional[str] = typer.Option(  # noqa: UP045
        None, "--ranks", help="How ranks start: fresh or warm (overrides the job file)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; start nothing."),
    detach: bool = typer.Option(False, "--detach", "-d", help=DETACH_HELP),
    ui: str = typer.Option("auto", "--ui", help="auto | live | plain | quiet"),
    connect_timeout: float = typer.Option(
        10.0, "--connect-timeout", help="Seconds to wait for each host's SSH connection."
    ),
    accept_new_host_keys: bool = typer.Option(
        False, "--accept-new-host-keys", help="Trust hosts not yet in known_hosts (shows keys)."
    ),
) -> int:
    """Launch a training job and follow it to the end (exit 0 only if every rank succeeded)."""
    from dmlctl.errors import UsageError
    from dmlctl.launch.api import LaunchOptions
    from dmlctl.launch.api import launch as run_launch
    from dmlctl.spec import load_job

    if ui not in UI_MODES:
        raise UsageError(f"--ui: expected one of {', '.join(UI_MODES)}, got {ui!r}")
    check_connect_timeout(connect_timeout)  # before anything is read or said
    if resume is not None:
        if job_file is not None:
            raise UsageError("give either a job file or --resume RUN, not both")
        return _resume(resume, detach=detach, ui=ui)
    if job_file is None:
        raise UsageError("missing the job file: dmlctl launch JOB.yaml (or --resume RUN)")
    job = _overridden(load_job(job_file), workers, ranks)
    spec = _cluster_spec(cluster, job.workers)
    options = LaunchOptions(
        detach=detach,
        dry_run=dry_run,
        ui=ui,  # type: ignore[arg-type]
        job_file=job_file,
        cluster_file=cluster,
        connect_timeout=connect_timeout,
        accept_new_host_keys=accept_new_host_keys,
        flags=tuple(
            name for name, given in (("workers", workers), ("ranks", ranks)) if given is not None
        ),
    )
    result = run_launch(job, spec, options=options, console=stdout_console())
    if detach:
        _started(result.run_id)
    return result.exit_code


def _overridden(job: JobSpec, workers: int | None, ranks: str | None) -> JobSpec:
    """``job`` with what ``--workers`` and ``--ranks`` set."""
    from dmlctl.spec import with_rank_start, with_workers

    if workers is not None:
        job = with_workers(job, workers)
    return job if ranks is None else with_rank_start(job, ranks)


def _cluster_spec(cluster: Path | None, workers: int | None) -> ClusterSpec:
    """The cluster file's spec, or this machine's: there, more workers than slots run
    oversubscribed (as under torchrun), with a warning on stderr."""
    from dmlctl.spec import load_cluster_file
    from dmlctl.spec.local import local_cluster_for

    if cluster is not None:
        spec = load_cluster_file(cluster)
        if spec.network.allow_public:
            stderr_console().print(
                f"dmlctl: warning: {cluster} allows public addresses (network.allow_public): "
                "the run's store and rendezvous listen where anyone on the way can reach "
                "them (see SECURITY.md)",
                markup=False,
                highlight=False,
            )
        return spec
    spec, note = local_cluster_for(workers)
    if note is not None:
        stderr_console().print(f"dmlctl: warning: {note}", markup=False, highlight=False)
    return spec


def _started(run_id: str) -> None:
    """Tell where a detached run is followed (stderr) and print its id (stdout)."""
    err = stderr_console()
    err.print(
        f"started run [bold]{run_id}[/] in the background; follow it with:",
        highlight=False,
    )
    err.print(
        f"  dmlctl attach {run_id}\n"
        f"  dmlctl status {run_id}\n  dmlctl logs {run_id} --follow\n  dmlctl stop {run_id}",
        highlight=False,
        markup=False,
    )
    print(run_id)


def _resume(run_id: str, *, detach: bool, ui: str) -> int:
    """``--resume RUN``: continue the run; prints its id when detached."""
    from dmlctl.launch.api import LaunchOptions
    from dmlctl.launch.resume import resume as resume_run

    options = LaunchOptions(detach=detach, ui=ui)  # type: ignore[arg-type]
    result = resume_run(run_id, options=options, console=stdout_console())
    if detach:
        _started(result.run_id)
    return result.exit_code


def register(app: typer.Typer) -> None:
    app.command()(launch)
