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

from dmlctl.protocol import ENV_ATTEMPT, ENV_RANK_DIR
from dmlctl.spec.restart import CheckpointSpec, RestartSpec


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
    host has the shipped dmlctl package), which runs ``torchrun_argv`` in ``workdir``.
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
    torchrun_argv: tuple[str, ...]
    env: Mapping[str, str]
    slots: int = 1  # the most workers the host may run (the cluster spec's slots)

    def agent_config(
        self, run_id: str, attempt: int = 0, stop_grace: float = 30.0
    ) -> dict[str, Any]:
        """The host agent's configuration for attempt ``attempt`` (0 = first), sent
        on its stdin (never on a command line); see :func:`attempt_config`.
        ``stop_grace``: seconds the ranks get after SIGTERM when the agent stops them."""
        config = {
            "run_id": run_id,
            "host": self.name,
            "workdir": self.workdir,
            "rank_dir": self.rank_dir,
            "argv": list(self.torchrun_argv),
            "env": dict(self.env),
            "nproc": self.nproc,
            "first_rank": self.first_rank,
            "stop_grace": stop_grace,
        }
        return attempt_config(config, attempt)


def attempt_rank_dir(rank_dir: str, attempt: int) -> str:
    """Where attempt ``attempt`` (0 = first) of a host keeps its rank files."""
    return rank_dir if attempt == 0 else f"{rank_dir}/attempt-{attempt}"


def attempt_config(config: dict[str, Any], attempt: int) -> dict[str, Any]:
    """The agent configuration for attempt ``attempt`` (0 = first): ``DMLCTL_ATTEMPT``
    is ``attempt + 1`` (the dashboard's count); later attempts also get a rank directory
    of their own (an agent never replays an earlier attempt's files) and their own
    rendezvous id."""
    env = {**config["env"], ENV_ATTEMPT: str(attempt + 1)}
    if attempt == 0:
        return {**config, "env": env}
    rank_dir = attempt_rank_dir(config["rank_dir"], attempt)
    argv = list(config["argv"])
    if "--rdzv-id" in argv:
        i = argv.index("--rdzv-id") + 1
        argv[i] = f"{argv[i]}.{attempt}"
    env[ENV_RANK_DIR] = rank_dir
    return {**config, "rank_dir": rank_dir, "argv": argv, "env": env}


@dataclass(frozen=True)
class LaunchPlan:
    """The whole run: hosts in node order, ranks in rank order."""

    run_id: str
    job_name: str
    strategy: str
    strategy_params: Mapping[str, Any]
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
    #: Parameter-server ranks among ``ranks`` (role ``server``).
    parameter_servers: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        data = dataclasses.asdict(self)
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
                    "torchrun_argv": tuple(h["torchrun_argv"]),
                    "env": dict(h["env"]),
                }
            )

        return LaunchPlan(
            run_id=data["run_id"],
            job_name=data["job_name"],
            strategy=data["strategy"],
            strategy_params=dict(data["strategy_params"]),
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
        )
