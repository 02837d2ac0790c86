"""The launch plan: plain data, built by :func:`dmlctl.plan.build.build_plan`.

A plan says everything that will happen on every host — ranks, roles, the exact
torchrun command and its environment — and nothing has happened yet. It
round-trips through JSON (``plan.json`` in the run directory; a detached controller
reads it back).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from dmlctl.agent_config import AgentConfig, StrategyChoice, TorchrunCommand
from dmlctl.mesh import MeshLayout, layout_from
from dmlctl.protocol import ENV_RUN_STORE
from dmlctl.redact import args_secrets, command_secrets, secret_values
from dmlctl.slurm.allocation import Allocation
from dmlctl.spec.restart import CheckpointSpec, RestartSpec
from dmlctl.strategies import registry


@dataclass(frozen=True)
class RankPlan:
    """One planned rank. torchrun assigns the final ranks at rendezvous; on one host
    (and with hosts joining in plan order) they are these."""

    rank: int
    host: str
    local_rank: int
    role: str


@dataclass(frozen=True)
class HostPlan:
    """What runs on one host: a host agent (started in ``agent_cwd``, where a remote
    host has the shipped dmlctl package), which runs ``torchrun`` in ``workdir``.
    Remote paths may start with ``~/`` (the login's home); the agent expands them."""

    name: str
    address: str
    is_local: bool
    port: int
    user: str | None
    identity_file: str | None
    node_rank: int
    nproc: int
    first_rank: int
    python: str
    workdir: str
    rank_dir: str
    agent_argv: tuple[str, ...]
    agent_cwd: str | None
    torchrun: TorchrunCommand
    env: Mapping[str, str]
    slots: int = 1  # the most workers the host may run (the cluster spec's slots)

    @property
    def torchrun_argv(self) -> tuple[str, ...]:
        """The torchrun command of the first attempt."""
        return self.torchrun.argv()


def attempt_rank_dir(rank_dir: str, attempt: int) -> str:
    """Where attempt ``attempt`` (0 = first) of a host keeps its rank files."""
    return rank_dir if attempt == 0 else f"{rank_dir}/attempt-{attempt}"


def attempt_rdzv_id(run_id: str, attempt: int) -> str:
    """The rendezvous id of attempt ``attempt`` (0 = first): each attempt its own."""
    return run_id if attempt == 0 else f"{run_id}.{attempt}"


@dataclass(frozen=True)
class LaunchPlan:
    """The whole run: hosts in node order, ranks in rank order."""

    run_id: str
    job_name: str
    strategy: str
    #: The job's strategy parameters, validated once by the spec (the strategy's
    #: ``Params``); the agents hand them to the ranks.
    strategy_params: BaseModel
    script: str
    args: tuple[str, ...]
    world_size: int
    rdzv_endpoint: str
    hosts: tuple[HostPlan, ...]
    ranks: tuple[RankPlan, ...]
    #: The job's ``restart:`` block, as validated.
    restart: RestartSpec = dataclasses.field(default_factory=RestartSpec)
    #: The job's ``checkpoint:`` block, as validated (None without one).
    checkpoint: CheckpointSpec | None = None
    #: Hosts of the cluster that run nothing now; a restart may use them instead of
    #: lost hosts (see :func:`dmlctl.plan.elastic.replan`).
    spares: tuple[HostPlan, ...] = ()
    #: Bounds of a restarted attempt: at least ``min_hosts`` hosts (0: all of
    #: ``hosts``), at most ``max_hosts`` (0: as many as ``hosts``), ``workers`` workers
    #: at most (0: ``world_size``).
    min_hosts: int = 0
    max_hosts: int = 0
    workers: int = 0
    #: Parameter-server ranks among ``ranks`` (role ``server``), and the hosts that
    #: run only servers (the job's ``server_hosts``; empty: servers go next to workers).
    parameter_servers: int = 0
    server_hosts: tuple[str, ...] = ()
    #: The job's device mesh (its ``parallelism:`` block resolved for ``workers``) and
    #: its ``parallelize: FILE:FUNCTION``; None without them. Every host's env carries
    #: both (``DMLCTL_PARALLELISM``, ``DMLCTL_PARALLELIZE``); re-plans keep them.
    mesh: MeshLayout | None = None
    parallelize: str | None = None
    #: The Slurm allocation the hosts are nodes of; None: SSH hosts or this machine.
    allocation: Allocation | None = None
    #: Where the controller holds the run's store (an address of this machine that
    #: every host reached), in a run that replaces lost hosts in place; each attempt
    #: gets a store of its own there. None: torchrun's store on rank 0's host.
    store_host: str | None = None
    #: Values dmlctl hides as ``***`` besides the secret env values: the job's
    #: ``secrets:``, the secret values in its args and setup
    #: (:func:`dmlctl.redact.args_secrets`, :func:`~dmlctl.redact.command_secrets`).
    #: ``plan.json`` shows them hidden; ``secrets.json`` keeps them.
    secrets: tuple[str, ...] = ()
    #: The run's own secret (:mod:`dmlctl.run_key`): what its channels authenticate
    #: with, made as the run is recorded (the planner stays pure). ``plan.json`` shows
    #: ``***``; ``secrets.json`` keeps it.
    key: str = ""

    def agent_config(
        self, host: HostPlan, attempt: int = 0, stop_grace: float = 30.0, store: str | None = None
    ) -> AgentConfig:
        """The configuration of ``host``'s agent for attempt ``attempt`` (0 = first):
        later attempts get a rank directory and a rendezvous id of their own (an agent
        never replays an earlier attempt's files). ``stop_grace``: seconds the ranks
        get after SIGTERM when the agent stops them. ``store``: the ``host:port`` of the
        attempt's store held by the controller (:attr:`store_host`), where every
        torchrun meets (none serves it) and every rank finds the run's store."""
        torchrun = dataclasses.replace(host.torchrun, rdzv_id=attempt_rdzv_id(self.run_id, attempt))
        env = dict(host.env)
        if store is not None:
            torchrun = dataclasses.replace(
                torchrun,
                rdzv_endpoint=store,
                is_host=False,
                run_store=True,
                node_rank=host.node_rank,
            )
            env[ENV_RUN_STORE] = store
        return AgentConfig(
            run_id=self.run_id,
            host=host.name,
            attempt=attempt,
            workdir=host.workdir,
            rank_dir=attempt_rank_dir(host.rank_dir, attempt),
            torchrun=torchrun,
            env=env,
            strategy=self.strategy_choice(),
            stop_grace=stop_grace,
            key=self.key,
            masked=self.hidden_values(),
        )

    def hidden_values(self) -> tuple[str, ...]:
        """Every value the run hides as ``***``: its hosts' secret env values, the secret
        values in their arguments and in the Slurm setup, :attr:`secrets` and
        :attr:`key` (a URL's password is hidden wherever it appears, known or not)."""
        hosts = (*self.hosts, *self.spares)
        found = [v for h in hosts for v in secret_values(h.env)]
        found += [v for h in hosts for v in args_secrets(h.torchrun.args)]
        found += [*self.secrets, *([self.key] if self.key else [])]
        if self.allocation is not None and self.allocation.setup:
            found += command_secrets(self.allocation.setup)
        return tuple(dict.fromkeys(found))

    def strategy_choice(self) -> StrategyChoice:
        """The strategy as every rank gets it: the name and the parameters the job set."""
        return StrategyChoice(self.strategy, self.params_data())

    def params_data(self) -> dict[str, Any]:
        """The strategy parameters as JSON data: the keys the job set."""
        return self.strategy_params.model_dump(mode="json", exclude_unset=True)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        data = dataclasses.asdict(self)
        data["strategy_params"] = self.params_data()
        data["restart"] = self.restart.model_dump(mode="json")
        checkpoint = self.checkpoint
        data["checkpoint"] = checkpoint.model_dump(mode="json") if checkpoint else None
        return data

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> LaunchPlan:
        """Inverse of :meth:`to_dict`."""

        def host(h: Mapping[str, Any]) -> HostPlan:
            return HostPlan(
                **{
                    **h,
                    "agent_argv": tuple(h["agent_argv"]),
                    "torchrun": TorchrunCommand.from_dict(h["torchrun"]),
                    "env": dict(h["env"]),
                }
            )

        return LaunchPlan(
            run_id=data["run_id"],
            job_name=data["job_name"],
            strategy=data["strategy"],
            strategy_params=registry.load(data["strategy"]).Params.model_validate(
                data["strategy_params"]
            ),
            script=data["script"],
            args=tuple(data["args"]),
            world_size=int(data["world_size"]),
            rdzv_endpoint=data["rdzv_endpoint"],
            hosts=tuple(host(h) for h in data["hosts"]),
            ranks=tuple(RankPlan(**r) for r in data["ranks"]),
            restart=RestartSpec.model_validate(data.get("restart") or {}),
            checkpoint=CheckpointSpec.model_validate(data["checkpoint"])
            if data.get("checkpoint")
            else None,
            spares=tuple(host(h) for h in data.get("spares", ())),
            min_hosts=int(data.get("min_hosts", 0)),
            max_hosts=int(data.get("max_hosts", 0)),
            workers=int(data.get("workers", 0)),
            parameter_servers=int(data.get("parameter_servers", 0)),
            server_hosts=tuple(data.get("server_hosts", ())),
            mesh=layout_from(data["mesh"]) if data.get("mesh") else None,
            parallelize=data.get("parallelize"),
            allocation=_allocation(data.get("allocation")),
            store_host=data.get("store_host"),
            secrets=tuple(data.get("secrets", ())),
            key=str(data.get("key", "")),
        )


def _allocation(data: Mapping[str, Any] | None) -> Allocation | None:
    return Allocation.from_dict(data) if data else None
