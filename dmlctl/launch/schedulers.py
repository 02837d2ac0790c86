"""Where a run's processes run, behind one small interface (:class:`Scheduler`):
this machine (:class:`LocalScheduler`) and hosts reached over SSH
(:class:`SshScheduler`); a batch scheduler is one more implementation.

A launch asks its scheduler for the facts a plan needs (:meth:`Scheduler.gather`),
makes the request from them with one pure function
(:func:`~dmlctl.plan.request.make_request`), prints it for ``--dry-run``, and
otherwise hands exactly it to :meth:`Scheduler.schedule`. A recorded run is
described, cancelled and its logs fetched through the scheduler of its plan
(:func:`scheduler_of`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Protocol

from rich.console import Console

from dmlctl.errors import DmlctlError, ProvisionError
from dmlctl.launch.options import LaunchOptions, LaunchResult
from dmlctl.launch.start import start_run
from dmlctl.plan.model import LaunchPlan
from dmlctl.plan.placing import JobPlacement, as_run
from dmlctl.plan.request import Facts, LaunchRequest
from dmlctl.provision.ports import ANY_FREE_PORT, free_port, pick_port
from dmlctl.provision.store_reach import LOOPBACK, controller_address, store_host
from dmlctl.runs.store import RunDir, RunStore
from dmlctl.spec.cluster import ResolvedHost
from dmlctl.spec.local import local_gpu_counts
from dmlctl.spec.models import ClusterSpec, JobSpec
from dmlctl.text import plural
from dmlctl.transport import Transport, close_transports, make_transports, network_address
from dmlctl.transport import ssh_route as _ssh_route

if TYPE_CHECKING:
    from dmlctl.provision.doctor import DoctorReport
    from dmlctl.transport.ssh import SshOptions

DRY_RUN_PORT = 29500  # shown by --dry-run for remote clusters: it connects to nothing
DRY_RUN_NOTE = f"port {DRY_RUN_PORT} shown; the real one is the first free port, chosen at launch"


class RecordedRuns(Protocol):
    """What a scheduler answers for a run it ran."""

    def describe(self, run: RunDir) -> list[str]:
        """Where the run's processes are, as lines for ``dmlctl status RUN``."""
        ...

    def cancel(self, run: RunDir, *, timeout: float) -> str:
        """Stop every process of the run (ranks get the job's ``stop_grace``); what
        happened, in one line."""
        ...

    def logs(self, run: RunDir) -> list[str]:
        """Copy the rank files kept where the ranks ran into the run directory; the
        hosts that could not be read, with why."""
        ...


class Scheduler(RecordedRuns, Protocol):
    """Runs a request's processes somewhere, and answers for them afterwards."""

    name: str

    def gather(self, job: JobSpec, cluster: ClusterSpec, placement: JobPlacement) -> Facts:
        """The facts a plan needs (port, GPUs, code id, routes). With
        ``options.dry_run`` nothing is connected to: what needs a host is assumed, and
        ``Facts.assumed`` says so. Raises :class:`ProvisionError` when a host is not
        ready (nothing started)."""
        ...

    def schedule(
        self, request: LaunchRequest, job: JobSpec, cluster: ClusterSpec, store: RunStore
    ) -> LaunchResult:
        """Carry out ``request``: its steps before the start, then the run (here until
        it ends, or detached)."""
        ...

    def release(self) -> None:
        """Close what :meth:`gather` opened, when no schedule follows (a refusal)."""
        ...


class RecordedRunBase:
    """What every scheduler does the same with a recorded run."""

    def cancel(self, run: RunDir, *, timeout: float) -> str:
        from dmlctl.runs.control import stop_run

        return stop_run(run, timeout=timeout)

    def logs(self, run: RunDir) -> list[str]:
        from dmlctl.provision.collect import fetch_rank_files

        return fetch_rank_files(run)


class LocalScheduler(RecordedRunBase):
    """This machine: ranks under a local agent, no SSH, nothing shipped."""

    name = "local"

    def __init__(self, options: LaunchOptions, console: Console) -> None:
        self._options, self._console = options, console

    def gather(self, job: JobSpec, cluster: ClusterSpec, placement: JobPlacement) -> Facts:
        """One torchrun (a single host, no spare) binds its rendezvous store to a port
        the kernel gives it as each attempt starts (``:0``, as ``torchrun --standalone``
        does; its ranks learn it as ``MASTER_PORT``), so no other process can take the
        port between the plan and the attempt; several local hosts meet at a port free
        now. This machine's GPUs were counted when placing. The run's store is held by
        the controller, on the loopback address: nothing of the run listens where
        another machine reaches it (:mod:`dmlctl.provision.store_server`)."""
        del cluster, job
        store = LOOPBACK
        if len(placement.hosts) == 1:
            note = ANY_FREE_PORT
            return Facts(port=0, local_python=sys.executable, port_note=note, store_host=store)
        return Facts(port=free_port(), local_python=sys.executable, store_host=store)

    def schedule(
        self, request: LaunchRequest, job: JobSpec, cluster: ClusterSpec, store: RunStore
    ) -> LaunchResult:
        plan = request.plan
        transports = make_transports(plan.hosts)
        return start_run(plan, transports, job, cluster, store, self._options, self._console)

    def describe(self, run: RunDir) -> list[str]:
        del run
        return ["where: this machine (no SSH)"]

    def release(self) -> None:
        return None  # gather opens nothing here


class SshScheduler(RecordedRunBase):
    """Hosts reached over SSH: preflight and port on the hosts, code and setup shipped
    to them, one agent per host over its SSH connection."""

    name = "ssh"

    def __init__(
        self,
        options: LaunchOptions,
        consoles: tuple[Console, Console],
        plan: LaunchPlan | None = None,
    ) -> None:
        self._options, (self._console, self._err) = options, consoles
        self._transports: dict[str, Transport] = {}
        self._plan = plan  # a recorded run's (for describe)

    def gather(self, job: JobSpec, cluster: ClusterSpec, placement: JobPlacement) -> Facts:
        dry = self._options.dry_run
        self._transports = make_transports(  # a dry run opens no connection
            cluster.resolved_hosts(), None if dry else _ssh_options(self._options, self._err)
        )
        first = as_run(placement.first, sys.executable)
        # The rendezvous needs the first host's network name, not an ~/.ssh/config alias.
        rdzv_host = network_address(self._transports[first.name], first.address)
        routes = {n: r for n, t in self._transports.items() if (r := _ssh_route(t)) is not None}
        from dmlctl.provision import ship

        lib = ship.lib_id(ship.package_files())
        if dry:
            assumed_store = _assumed_store(placement, self._transports)
            close_transports(self._transports)
            assumed = _unprobed(cluster) + _store_assumed(assumed_store)
            return Facts(
                DRY_RUN_PORT,
                sys.executable,
                rdzv_host,
                {},
                lib,
                routes,
                assumed,
                DRY_RUN_NOTE,
                store_host=assumed_store,
            )
        try:
            port, gpus = self._preflight(placement, first)
            store = self._store_host(placement)
        except BaseException:
            close_transports(self._transports)
            raise
        gpus.update(local_gpu_counts(job, cluster))  # as this machine's ranks see them
        return Facts(port, sys.executable, rdzv_host, gpus, lib, routes, store_host=store)

    def _store_host(self, placement: JobPlacement) -> str | None:
        """Where the controller holds the run's store: an address of this machine
        every host reached; None, said on stderr, when one could not."""
        hosts = [as_run(h, sys.executable) for h in placement.hosts]
        timeout = self._options.connect_timeout
        with self._err.status("checking that every host reaches this machine…"):
            where = store_host(hosts, self._transports, timeout)
        if where.why_not is not None:
            self._err.print(
                f"the run's store stays with rank 0's host ({where.why_not}): losing that "
                "host restarts the run",
                markup=False,
            )
        return where.address

    def _preflight(
        self, placement: JobPlacement, first: ResolvedHost
    ) -> tuple[int, dict[str, int]]:
        """The rendezvous port free on the first placed host, every host checked with
        it (refusing with one table), and each host's GPU count."""
        from dmlctl.provision.doctor import run_doctor
        from dmlctl.provision.doctor_view import render_doctor

        hosts = [as_run(h, sys.executable) for h in placement.hosts]
        timeout = self._options.connect_timeout
        with self._err.status(f"checking {plural(len(hosts), 'host')}…"):
            try:
                port = (
                    free_port()
                    if first.is_local
                    else pick_port(self._transports[first.name], first.python, timeout)
                )
            except ProvisionError:  # the first host is out of reach: every host's row says so
                port = DRY_RUN_PORT
            # torch's facts may come from each host's previous probe (unchanged since)
            report = run_doctor(hosts, self._transports, rdzv_port=port, reuse_torch=True)
        if not report.ok:
            self._console.print(render_doctor(report))
            raise ProvisionError(
                f"preflight failed on {len(report.failures())} of "
                f"{plural(len(hosts), 'host')}; nothing started"
            )
        return port, _probed_gpus(report)

    def schedule(
        self, request: LaunchRequest, job: JobSpec, cluster: ClusterSpec, store: RunStore
    ) -> LaunchResult:
        from dmlctl.provision import ship

        plan, transports = request.plan, self._transports
        try:
            ship.sync_code(plan, job, transports, self._err)
            ship.run_setup(plan, job, transports, self._err)
        except BaseException:
            close_transports(transports)
            raise
        return start_run(plan, transports, job, cluster, store, self._options, self._console)

    def release(self) -> None:
        close_transports(self._transports)

    def describe(self, run: RunDir) -> list[str]:
        return _where(run, self._plan) if self._plan is not None else []


def _where(run: RunDir, plan: LaunchPlan) -> list[str]:
    """The hosts a run's ranks were on at its last record (a run that moved onto a
    spare shows it), with the address each is reached at; from the run directory only."""
    try:
        names = sorted({r.host for r in run.read_state().ranks})
    except DmlctlError as e:
        return [f"where: unknown ({e})"]
    hosts = {h.name: h for h in (*plan.hosts, *plan.spares)}
    lines = [f"where: {plural(len(names), 'host')} over SSH"]
    for name in names:
        host = hosts.get(name)
        reached = "unknown" if host is None else host.address
        lines.append(f"  {name}: {'this machine' if host and host.is_local else reached}")
    return lines


def _assumed_store(placement: JobPlacement, transports: dict[str, Transport]) -> str:
    """The address a dry run shows for the controller's store (it connects to nothing)."""
    remote = [h for h in placement.hosts if not h.is_local]
    if not remote:
        return LOOPBACK
    return controller_address(network_address(transports[remote[0].name], remote[0].address))


def _store_assumed(address: str) -> tuple[str, ...]:
    """What a dry run assumes of the controller's store at ``address``."""
    if address == LOOPBACK:
        return ()
    return (
        f"that every host reaches this machine at {address} (the run's store; checked at launch)",
    )


def _unprobed(cluster: ClusterSpec) -> tuple[str, ...]:
    """What a dry run cannot know about hosts it does not probe."""
    notes = ["the remote hosts' GPU counts: a launch refuses more NCCL workers than a host's GPUs"]
    if unset := cluster.unset_slots():
        notes.append(
            f"slots of {', '.join(unset)} as the cluster file leaves them; a launch gives a "
            "host with more than one GPU its GPU count"
        )
    return tuple(notes)


def _ssh_options(options: LaunchOptions, console: Console) -> SshOptions:
    from dmlctl.transport.ssh import SshOptions

    def shown(name: str, key_type: str, fp: str) -> None:
        console.print(f"added host key of {name} to known_hosts: {key_type} {fp}", markup=False)

    return SshOptions(
        connect_timeout=options.connect_timeout,
        accept_new_host_keys=options.accept_new_host_keys,
        on_new_key=shown,
    )


def _probed_gpus(report: DoctorReport) -> dict[str, int]:
    """Each probed host's GPU count, as PyTorch there sees it."""
    return {h.host: int(h.facts.get("gpus") or 0) for h in report.hosts if h.facts}
