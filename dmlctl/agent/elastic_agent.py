"""dmlctl's elastic agent: torch's ``LocalElasticAgent``, extended where torch invites it.

:class:`DmlctlAgent` overrides the agent's template methods, as DeepSpeed's
``DSElasticAgent`` does, and :func:`launch` runs it as torch's
``torch.distributed.launcher.api.launch_agent`` runs torch's own agent. What differs
from torchrun, and why:

* **The controller decides every restart.** The agent runs one attempt and returns
  its result (:meth:`DmlctlAgent._invoke_run`); it never restarts its workers by
  itself. The ranks still see torchrun's restart variables:
  ``TORCHELASTIC_RESTART_COUNT`` is the number of restarts so far in the run and
  ``TORCHELASTIC_MAX_RESTARTS`` the run's budget.
* **Ranks replaced in place.** With ``restart.mode: in_place``, or with
  ``ranks.start: warm``, the ranks are dmlctl's processes
  (:class:`~dmlctl.agent.rank_procs.RankProcesses`); otherwise torch starts them.
* **The exit barrier of an in-place run** waits until every rank of the world is done
  with the run's store, whichever process runs the rank now (a lost host's ranks run
  under a stand-in, :mod:`dmlctl.agent.standin`, which never reaches torchrun's barrier).

Each rank's environment is the one torch's agent builds, variable for variable
(:meth:`DmlctlAgent._rank_envs`; compared with bare torchrun's in the tests).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from torch.distributed.elastic.agent.server.api import (
    DEFAULT_ROLE,
    RunResult,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.utils.api import macros
from torch.distributed.launcher.api import LaunchConfig

from dmlctl import protocol
from dmlctl.agent.rank_procs import FreshStarter, RankProcesses, Starter, shutdown_timeout

EXIT_WAIT_S = 60.0
"""How long the torchrun of an in-place run waits at its end for every rank of the
world to be done with the run's store."""
EXIT_CONNECT_S = 3.0
"""How long it tries to reach the store at its end: one that cannot has lost the race
with the store's torchrun, which ends once every rank is done."""
EXIT_LINGER_S = 1.0
"""How long the store's torchrun (node 0) stays after every rank is done, so that the
other nodes' torchruns, a monitor interval behind, still find it at their end."""

_SPEC_EXTRAS = (
    "local_addr",
    "event_log_handler",
    "numa_options",
    "duplicate_stdout_filters",
    "duplicate_stderr_filters",
    "virtual_local_rank",
)
"""``LaunchConfig`` fields that torch's ``launch_agent`` passes on to its ``WorkerSpec``
(those this torch has)."""
_AGENT_EXTRAS = ("start_method", "log_line_prefix_template", "shutdown_timeout")
"""``LaunchConfig`` fields that it passes on to its agent (those this torch has)."""


class DmlctlAgent(LocalElasticAgent):
    """torch's local elastic agent for one attempt of a dmlctl run (see the module).

    ``restart_count`` restarts of the run came before this attempt. ``starter`` (the
    zygote's, for ``ranks.start: warm``) starts the ranks, which then are dmlctl's
    processes (:class:`RankProcesses`), as they are for ``restart.mode: in_place``;
    otherwise torch starts them."""

    def __init__(
        self,
        spec: WorkerSpec,
        logs_specs: Any,
        restart_count: int = 0,
        starter: Starter | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(spec, logs_specs, **kwargs)
        # torch counts restarts as the budget less what remains of it.
        self._remaining_restarts = spec.max_restarts - restart_count
        self._in_place = protocol.in_place(os.environ)
        self._starter = starter
        self._ranks: RankProcesses | None = None

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """Start the workers, watch them until the attempt's outcome is known."""
        group = self._worker_group
        self._initialize_workers(group)
        while True:
            time.sleep(group.spec.monitor_interval)
            result = self._monitor_workers(group)
            group.state = result.state
            if result.state == WorkerState.SUCCEEDED:
                self._exit_barrier()
                return result
            if result.state in (WorkerState.UNHEALTHY, WorkerState.FAILED):
                self._stop_workers(group)
                group.state = WorkerState.FAILED
                return result
            # HEALTHY: a node that comes now waits for the controller's next attempt.

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        if not (self._in_place or self._starter is not None):
            started: dict[int, Any] = super()._start_workers(worker_group)
            return started
        envs = self._rank_envs(worker_group)
        spec = worker_group.spec
        commands = {}
        for worker in worker_group.workers:
            args = macros.substitute(list(spec.args), str(worker.local_rank))
            argv = (str(spec.entrypoint), *map(str, args))
            commands[worker.local_rank] = (argv, {**os.environ, **envs[worker.local_rank]})
        handle_stop_signals()
        starter = self._starter or FreshStarter()
        self._ranks = RankProcesses(starter, commands, respawn_lost=self._in_place)
        return self._ranks.pids()

    def _rank_envs(self, worker_group: WorkerGroup) -> dict[int, dict[str, str]]:
        """What torch's ``_start_workers`` gives each local rank on top of the agent's
        own environment, with its error file (torch's ``LogsSpecs``)."""
        spec = worker_group.spec
        restart_count = spec.max_restarts - self._remaining_restarts
        envs: dict[int, dict[str, str]] = {}
        for worker in worker_group.workers:
            env = {
                "RANK": str(worker.global_rank),
                "GROUP_RANK": str(worker_group.group_rank),
                "ROLE_RANK": str(worker.role_rank),
                "ROLE_NAME": spec.role,
                "LOCAL_WORLD_SIZE": str(spec.local_world_size),
                "WORLD_SIZE": str(worker.world_size),
                "GROUP_WORLD_SIZE": str(worker_group.group_world_size),
                "ROLE_WORLD_SIZE": str(worker.role_world_size),
                "MASTER_ADDR": str(worker_group.master_addr),
                "MASTER_PORT": str(worker_group.master_port),
                "TORCHELASTIC_RESTART_COUNT": str(restart_count),
                "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
                "TORCHELASTIC_RUN_ID": spec.rdzv_handler.get_run_id(),
                "TORCHELASTIC_USE_AGENT_STORE": str(spec.rdzv_handler.use_agent_store),
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv(
                    "TORCH_NCCL_ASYNC_ERROR_HANDLING", str(1)
                ),
            }
            self._local_rank_env(env, worker.local_rank, spec)
            if "OMP_NUM_THREADS" in os.environ:
                env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
            envs[worker.local_rank] = env
        self._setup_local_watchdog(envs=envs)
        self._setup_healthcheck()
        self._logs_specs.reify(envs)  # each rank's TORCHELASTIC_ERROR_FILE
        return envs

    def _local_rank_env(self, env: dict[str, str], local_rank: int, spec: WorkerSpec) -> None:
        """``LOCAL_RANK`` (and ``CUDA_VISIBLE_DEVICES``) as this torch sets them."""
        own: Callable[..., None] | None = getattr(self, "_set_local_rank_env", None)
        if own is not None:
            own(env, local_rank, spec)
            return
        env["LOCAL_RANK"] = str(local_rank)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        if self._ranks is None:
            result: RunResult = super()._monitor_workers(worker_group)
            return result
        ended = self._ranks.ended()
        failed = {lr: code for lr, code in ended.items() if code != 0}
        if failed:
            envs = self._ranks.envs()
            pids = self._ranks.pids()
            failures = {
                worker_group.workers[lr].global_rank: ProcessFailure(
                    lr, pids[lr], code, envs[lr].get("TORCHELASTIC_ERROR_FILE", "")
                )
                for lr, code in failed.items()
            }
            return RunResult(state=WorkerState.FAILED, failures=failures)
        if len(ended) == len(worker_group.workers):
            values = {w.global_rank: None for w in worker_group.workers}
            return RunResult(state=WorkerState.SUCCEEDED, return_values=values)
        return RunResult(state=WorkerState.HEALTHY)

    def _shutdown(self, *args: Any, **kwargs: Any) -> None:
        if self._ranks is not None:
            sig = args[0] if args else kwargs.get("death_sig")
            self._ranks.close(sig or 15, shutdown_timeout())
        super()._shutdown(*args, **kwargs)

    def _exit_barrier(self) -> None:
        if not self._in_place:
            super()._exit_barrier()  # type: ignore[no-untyped-call]
            return
        wait_for_ranks(self._worker_group, linger=os.environ.get(protocol.ENV_RUN_STORE) is None)


def handle_stop_signals(environ: Mapping[str, str] = os.environ) -> None:
    """Have the signals torch's process context handles (``TORCHELASTIC_SIGNALS_TO_HANDLE``,
    by default SIGTERM, SIGINT, SIGHUP and SIGQUIT) raise torch's ``SignalException``
    in this main thread, as torch's context has them raise it when it starts its ranks:
    the agent then stops the ranks, who get the shutdown timeout to end."""
    import signal
    import threading

    # torch's own handler: raises its SignalException, as in torch's process context
    from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler

    if threading.current_thread() is not threading.main_thread():
        return
    names = environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    for name in names.split(","):
        sig = getattr(signal, name.strip(), None)
        if isinstance(sig, signal.Signals):
            signal.signal(sig, _terminate_process_handler)


def wait_for_ranks(
    group: WorkerGroup,
    linger: bool,
    timeout: float = EXIT_WAIT_S,
    reach: float = EXIT_CONNECT_S,
) -> None:
    """The exit barrier of an in-place run: wait until every rank of the world said it
    is done with the run's store (:func:`dmlctl.runtime.rejoin.done`), at most
    ``timeout`` seconds. One that cannot reach the store within ``reach`` seconds
    ends at once (the store's torchrun has ended: every rank was done). With
    ``linger`` (a torchrun serves the store) node 0 stays :data:`EXIT_LINGER_S` more."""
    from dmlctl.runtime import rejoin

    try:
        store = rejoin.connect(
            str(group.master_addr), int(group.master_port or 0), timedelta(seconds=reach)
        )
    except Exception:  # the store's torchrun ended: every rank was done
        return
    try:
        world = int(group.workers[0].world_size)
        store.wait([rejoin.done_key(r) for r in range(world)], timedelta(seconds=timeout))
    except Exception as exc:  # the run's outcome is its ranks', not this wait's
        print(f"dmlctl: not every rank said it is done with the store: {exc}", file=sys.stderr)
        return
    if linger and int(group.group_rank or 0) == 0 and int(group.group_world_size or 1) > 1:
        time.sleep(EXIT_LINGER_S)  # other nodes' torchruns may still come


def _present(names: tuple[str, ...], obj: Any, accepted: set[str]) -> dict[str, Any]:
    """``obj``'s attributes among ``names`` that ``accepted`` names."""
    return {name: getattr(obj, name) for name in names if name in accepted and hasattr(obj, name)}


def make_agent(
    config: LaunchConfig,
    entrypoint: str,
    args: list[str],
    restart_count: int,
    starter: Starter | None,
) -> DmlctlAgent:
    """The agent for ``config``, made as torch's ``launch_agent`` makes its own."""
    params = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    spec_fields = {f.name for f in dataclasses.fields(WorkerSpec)}
    spec = WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=entrypoint,
        args=tuple(args),
        rdzv_handler=rendezvous_handler_registry.create_handler(params),
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        **_present(_SPEC_EXTRAS, config, spec_fields),
    )
    agent_params = set(inspect.signature(LocalElasticAgent.__init__).parameters)
    extras = _present(_AGENT_EXTRAS, config, agent_params)
    return DmlctlAgent(spec, config.logs_specs, restart_count, starter, **extras)


def entrypoint_name(entrypoint: str, args: list[str]) -> str:
    """The name torchrun gives the job in its failure report: the module or script
    after the interpreter's options."""
    if entrypoint == sys.executable:
        return next((arg for arg in args if not arg.startswith("-")), "")
    return entrypoint


def run_agent(agent: DmlctlAgent, config: LaunchConfig) -> RunResult:
    """Run ``agent`` for one attempt, with torch's metrics set up as ``launch_agent``
    sets them, and close the rendezvous after it (unless a signal ended the agent)."""
    from torch.distributed.elastic.metrics import initialize_metrics
    from torch.distributed.elastic.metrics.api import MetricsConfig
    from torch.distributed.elastic.multiprocessing.api import SignalException

    signals = getattr(config, "signals_to_handle", None)
    if signals is not None:  # torchrun's own variable, seen by every rank
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = str(signals)
    handler = agent.get_worker_group().spec.rdzv_handler
    shutdown = True
    try:
        initialize_metrics(MetricsConfig(config.metrics_cfg))
        result: RunResult = agent.run()
        return result
    except SignalException:
        shutdown = False  # as torch: a signalled agent leaves the rendezvous open
        raise
    finally:
        if shutdown:
            handler.shutdown()
