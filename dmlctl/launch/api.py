"""``launch``: the library call behind ``dmlctl launch`` (and ``dmlctl bench``).

Order of work, so that bad input never leaves anything behind: validate and place
(pure, every plan-time refusal) → on a remote cluster pick transports (may refuse a
host), the rendezvous port on the first placed host and preflight every host →
plan, once → only then create the run directory, record specs and plan, and start
(foreground or detached).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Console

from dmlctl.errors import PlanError, ProvisionError
from dmlctl.plan.build import JobPlacement, as_run, build_plan, check_gpus, place_job
from dmlctl.plan.model import LaunchPlan
from dmlctl.plan.render import render_plan
from dmlctl.provision.ports import free_port, pick_port
from dmlctl.redact import Redactor, redact_arg
from dmlctl.runs import secrets as run_secrets
from dmlctl.runs.files import StoreError, private_opener, private_umask
from dmlctl.runs.state import RunState, new_run_state
from dmlctl.runs.store import RunDir, RunStore, new_run_id
from dmlctl.spec.local import count_local_gpus
from dmlctl.spec.locate import locate
from dmlctl.spec.models import ClusterSpec, JobSpec
from dmlctl.text import plural
from dmlctl.transport import (
    Transport,
    close_transports,
    make_transports,
    network_address,
    ssh_route,
)
from dmlctl.ui.sinks import UiMode, make_sink

if TYPE_CHECKING:
    from collections.abc import Iterator

    from dmlctl.provision.doctor import DoctorReport
    from dmlctl.transport.ssh import SshOptions


DRY_RUN_PORT = 29500  # shown by --dry-run for remote clusters: it connects to nothing


@dataclass(frozen=True)
class LaunchOptions:
    detach: bool = False
    dry_run: bool = False
    ui: UiMode = "auto"
    home: Path | None = None
    job_file: Path | None = None
    cluster_file: Path | None = None
    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False
    #: Job keys set by command-line flags (``workers`` for ``--workers``): problems
    #: with them name the flag, not a line of the job file.
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchResult:
    """``run_dir`` is None for a dry run; ``state`` is None unless the run ran here."""

    run_id: str
    run_dir: Path | None
    state: RunState | None
    exit_code: int


def _spec_copy(model: JobSpec | ClusterSpec, source: Path | None, redactor: Redactor) -> str:
    """The YAML kept in ``specs/``: the spec as validated, every env value redacted,
    each secret-holding argument in its redacted form, and any known secret hidden
    wherever else it stands (``args``, ``setup``)."""
    data = model.model_dump(mode="json", exclude_defaults=True)
    for env in _envs_of(data):
        env.update(run_secrets.redacted_env(env))
    if "args" in data:  # a token or URL password in an argument, as the plan shows it
        data["args"] = [redact_arg(a) for a in data["args"]]
    head = f"# {source} as validated by dmlctl; env values redacted\n" if source else ""
    return head + redactor.text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def _envs_of(data: dict[str, Any]) -> list[dict[str, str]]:
    """The ``env`` mappings of a dumped job or cluster spec."""
    holders = [data, data.get("defaults") or {}, *(data.get("hosts") or [])]
    return [h["env"] for h in holders if isinstance(h.get("env"), dict)]


def plan_run(
    job: JobSpec,
    cluster: ClusterSpec,
    store: RunStore,
    *,
    port: int,
    lib: str = "dev",
    run_id: str | None = None,
    rdzv_host: str | None = None,
    placement: JobPlacement | None = None,
) -> LaunchPlan:
    """The plan for ``run_id`` (default: a new id), placed by ``placement`` (default:
    :func:`~dmlctl.plan.build.place_job`); pure apart from making the id."""
    run_id = run_id or new_run_id(job.name or "job", time.time())
    return build_plan(
        cluster,
        job,
        run_id=run_id,
        rdzv_port=port,
        local_python=sys.executable,
        local_run_dir=str(store.root / run_id),
        lib_id=lib,
        rdzv_host=rdzv_host,
        placement=placement,
    )


def create_run(
    plan: LaunchPlan, job: JobSpec, cluster: ClusterSpec, store: RunStore, options: LaunchOptions
) -> RunDir:
    """Make the run directory with specs, plan (env values redacted; the values in
    ``secrets.json``) and an initial state. A failure (a full disk) removes what was
    made and raises :class:`~dmlctl.runs.files.StoreError`."""
    run = store.create(plan.run_id)
    hosts = cluster.resolved_hosts()
    redactor = Redactor.for_envs([job.env, *(h.env for h in hosts)])
    try:
        run.write_text(run.specs / "job.yaml", _spec_copy(job, options.job_file, redactor))
        run.write_text(
            run.specs / "cluster.yaml", _spec_copy(cluster, options.cluster_file, redactor)
        )
        run.write_plan(plan.to_dict(), {h.name: {*job.env, *h.env} for h in hosts})
        run.write_state(
            new_run_state(
                plan.run_id,
                plan.job_name,
                plan.strategy,
                [(r.rank, r.host, r.role) for r in plan.ranks],
                time.time(),
                plan.mesh,
            )
        )
    except StoreError:
        shutil.rmtree(run.path, ignore_errors=True)
        raise
    return run


def detach(run: RunDir, *, resume: bool = False) -> int:
    with open(run.controller_log, "ab", opener=private_opener) as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dmlctl.launch.controller",
                str(run.path),
                *(["--resume"] if resume else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    run.write_pid(proc.pid)
    return proc.pid


def _ssh_options(options: LaunchOptions, console: Console) -> SshOptions:
    from dmlctl.transport.ssh import SshOptions

    def shown(name: str, key_type: str, fp: str) -> None:
        console.print(f"added host key of {name} to known_hosts: {key_type} {fp}", markup=False)

    return SshOptions(
        connect_timeout=options.connect_timeout,
        accept_new_host_keys=options.accept_new_host_keys,
        on_new_key=shown,
    )


def _prepare_remote(
    job: JobSpec,
    cluster: ClusterSpec,
    store: RunStore,
    placement: JobPlacement,
    options: LaunchOptions,
    consoles: tuple[Console, Console],
) -> tuple[LaunchPlan, dict[str, Transport]]:
    """Preflight every host (refusing with one table) with the rendezvous port free
    on the first placed host, then plan (once), sync the code and run the setup
    command. ``consoles``: (stdout, stderr)."""
    from dmlctl.provision import ship
    from dmlctl.provision.doctor import run_doctor
    from dmlctl.provision.doctor_view import render_doctor

    console, err = consoles
    transports = make_transports(cluster.resolved_hosts(), _ssh_options(options, err))
    first = as_run(placement.first, sys.executable)
    # The rendezvous needs the first host's network name, not an ~/.ssh/config alias.
    rdzv_host = network_address(transports[first.name], first.address)
    # Probe what the run will use: on localhost, the interpreter running dmlctl.
    hosts = [as_run(h, sys.executable) for h in placement.hosts]
    with err.status(f"checking {plural(len(hosts), 'host')}…"):
        port = (
            free_port()
            if first.is_local
            else pick_port(transports[first.name], first.python, options.connect_timeout)
        )
        # torch's facts may come from each host's previous probe (unchanged since)
        report = run_doctor(hosts, transports, rdzv_port=port, reuse_torch=True)
    if not report.ok:
        console.print(render_doctor(report))
        raise ProvisionError(
            f"preflight failed on {len(report.failures())} of {plural(len(hosts), 'host')}; "
            "nothing started"
        )
    gpus = _probed_gpus(report)
    placement = _slots_from_gpus(job, cluster, placement, gpus, options, err)
    with _located(options):
        check_gpus(job, placement.placed, gpus)
    lib = ship.lib_id(ship.package_files())
    plan = plan_run(
        job, cluster, store, port=port, lib=lib, rdzv_host=rdzv_host, placement=placement
    )
    ship.sync_code(plan, job, transports, err)
    ship.run_setup(plan, job, transports, err)
    return plan, transports


def _slots_from_gpus(
    job: JobSpec,
    cluster: ClusterSpec,
    placement: JobPlacement,
    gpus: Mapping[str, int],
    options: LaunchOptions,
    err: Console,
) -> JobPlacement:
    """The placement again when a host whose ``slots`` the cluster file leaves unset
    has more than one GPU: its slots are then its GPU count (one worker per GPU, as on
    this machine); else ``placement`` as it is. Says which hosts it sized."""
    sized = {name: gpus[name] for name in cluster.unset_slots() if gpus.get(name, 0) > 1}
    if not sized:
        return placement
    said = ", ".join(f"{name}: {n}" for name, n in sized.items())
    err.print(f"dmlctl: slots from the hosts' GPU counts ({said})", markup=False)
    return _place(job, cluster.with_slots(sized), options)


def _probed_gpus(report: DoctorReport) -> dict[str, int]:
    """Each probed host's GPU count, as PyTorch there sees it."""
    return {h.host: int(h.facts.get("gpus") or 0) for h in report.hosts if h.facts}


def _place(job: JobSpec, cluster: ClusterSpec, options: LaunchOptions) -> JobPlacement:
    """Every plan-time check, before any host is touched (this machine's GPUs
    counted, as its ranks will see them); a refusal names the spec file and line of
    the key at fault (or the flag that set it)."""
    local = {
        h.name: count_local_gpus({**os.environ, **job.env, **h.env})
        for h in cluster.resolved_hosts()
        if h.is_local
    }
    with _located(options):
        return place_job(cluster, job, gpus=local)


@contextlib.contextmanager
def _located(options: LaunchOptions) -> Iterator[None]:
    """A :class:`PlanError` raised inside becomes the user's error naming the spec
    file and line of the key at fault (or the flag that set it)."""
    try:
        yield
    except PlanError as e:
        files = (options.job_file, options.cluster_file)
        job_file, cluster_file = (os.fspath(f) if f is not None else None for f in files)
        raise locate(e, job_file, cluster_file, options.flags) from None


def _start(
    plan: LaunchPlan,
    transports: dict[str, Transport],
    job: JobSpec,
    cluster: ClusterSpec,
    store: RunStore,
    options: LaunchOptions,
    console: Console,
) -> LaunchResult:
    """Record the run and run its controller: here (until the run ends) or detached."""
    from dmlctl.launch.controller import run_controller

    with private_umask():  # every file of the run is the user's alone
        try:
            run = create_run(plan, job, cluster, store, options)
        except StoreError:
            close_transports(transports)
            raise
        if options.detach:
            close_transports(transports)
            pid = detach(run)
            return LaunchResult(plan.run_id, run.path, None, 0 if pid else 1)
        run.write_pid(os.getpid())
        sink = make_sink(options.ui, console, str(run.path))
        state = run_controller(run, plan, sink, transports)
    return LaunchResult(plan.run_id, run.path, state, int(state.exit_code or 0))


def _dry_run(
    job: JobSpec,
    cluster: ClusterSpec,
    store: RunStore,
    placement: JobPlacement,
    console: Console,
    is_remote: bool,
) -> LaunchResult:
    """Print the plan; connect to nothing. Remote hosts show how ~/.ssh/config
    resolves them, the rendezvous the first host's network name and
    :data:`DRY_RUN_PORT` (the real port is chosen at launch)."""
    if not is_remote:
        plan = plan_run(job, cluster, store, port=free_port(), placement=placement)
        console.print(render_plan(plan), markup=False, highlight=False)
        return LaunchResult("", None, None, 0)
    transports = make_transports(cluster.resolved_hosts())  # opens no connection
    first = placement.first
    rdzv_host = network_address(transports[first.name], first.address)
    plan = plan_run(
        job, cluster, store, port=DRY_RUN_PORT, placement=placement, rdzv_host=rdzv_host
    )
    routes = {name: r for name, t in transports.items() if (r := ssh_route(t)) is not None}
    note = f"port {DRY_RUN_PORT} shown; the real one is the first free port, chosen at launch"
    console.print(render_plan(plan, routes, note), markup=False, highlight=False)
    close_transports(transports)
    return LaunchResult("", None, None, 0)


def launch(
    job: JobSpec, cluster: ClusterSpec, *, options: LaunchOptions, console: Console
) -> LaunchResult:
    """Run ``job`` on ``cluster``; blocks until the run ends unless detached or dry.

    Exit code: 0 every rank succeeded, 1 the run failed (or a host could not be made
    ready), 130 stopped; raises DmlctlError (exit 2) for bad input before anything is
    created or started. The job is placed and planned once. A dry run connects to
    nothing (a remote cluster's rendezvous port is shown as :data:`DRY_RUN_PORT`).
    """
    store = RunStore(options.home)
    is_remote = any(not h.is_local for h in cluster.resolved_hosts())
    placement = _place(job, cluster, options)
    if job.advice is not None:
        console.print(f"dmlctl: {job.advice}", markup=False, highlight=False)
    if options.dry_run:
        return _dry_run(job, cluster, store, placement, console, is_remote)
    if is_remote:
        err = Console(stderr=True, highlight=False)
        plan, transports = _prepare_remote(job, cluster, store, placement, options, (console, err))
    else:
        plan = plan_run(job, cluster, store, port=free_port(), placement=placement)
        transports = make_transports(plan.hosts)
    return _start(plan, transports, job, cluster, store, options, console)
