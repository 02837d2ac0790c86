"""What the controller sends a host agent for one attempt (the first line of its stdin):
the :class:`AgentConfig` — its run, attempt, directories, environment, the strategy
with its parameters (:class:`StrategyChoice`) and its torchrun command
(:class:`TorchrunCommand`). Standard library only (no torch, no I/O at import)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from dmlctl.protocol import (
    DEFAULT_STRATEGY,
    ENV_ATTEMPT,
    ENV_RANK_DIR,
    ENV_STRATEGY,
    ENV_STRATEGY_PARAMS,
)

WARM_FLAG = "--warm"
"""On the host agent's command line: the job's ``ranks.start`` is ``warm``, so the agent
forks its zygote as it starts, before its configuration comes (:mod:`dmlctl.agent.zygote`)."""
RDZV_BACKEND = "dmlctl"
"""The rendezvous backend every host's torchrun uses, registered through torch's
rendezvous registry (:mod:`dmlctl.agent.rendezvous`)."""
TORCHRUN_MODULE = "dmlctl.agent.torchrun"
"""torchrun as a host runs it: ``torch.distributed.run`` that writes down its failed
ranks for the agent (:mod:`dmlctl.agent.torchrun`)."""


@dataclass(frozen=True)
class TorchrunCommand:
    """One host's torchrun command (the real elastic agent, c10d rendezvous), as fields.

    Each worker runs ``dmlctl.runtime.entry``, which records the rank's start and exit
    and then runs ``script`` unchanged, as torchrun would. ``is_host`` tells torchrun
    whether this host serves the c10d store (instead of a guess from host names, which
    fails on multi-homed machines and loopback test hosts); ``local_addr`` (the first
    host of a multi-host run) becomes MASTER_ADDR, so ranks meet at the address the
    preflight checked. ``rdzv_id`` is the rendezvous id of one attempt; ``run_name``
    the run's id, the same in every attempt (the ranks' ``TORCHELASTIC_RUN_ID``);
    ``max_restarts`` the run's restart budget (their ``TORCHELASTIC_MAX_RESTARTS``;
    the controller decides every restart, the host never restarts by itself).
    ``run_store``: the nodes meet at the run's store (the controller's, at
    ``rdzv_endpoint``) and the ranks use it, instead of one that a torchrun serves
    (:mod:`dmlctl.agent.rendezvous`); there this host is node ``node_rank`` of the plan.
    """

    python: str
    nnodes: int
    nproc: int
    rdzv_endpoint: str
    rdzv_id: str
    script: str
    args: tuple[str, ...] = ()
    is_host: bool = True
    local_addr: str | None = None
    run_name: str = ""
    max_restarts: int = 0
    run_store: bool = False
    node_rank: int | None = None

    def argv(self) -> tuple[str, ...]:
        """The exact command line."""
        return (
            self.python,
            "-m",
            TORCHRUN_MODULE,
            "--nnodes",
            str(self.nnodes),
            "--nproc-per-node",
            str(self.nproc),
            "--rdzv-backend",
            RDZV_BACKEND,
            "--rdzv-endpoint",
            self.rdzv_endpoint,
            "--rdzv-id",
            self.rdzv_id,
            "--rdzv-conf",
            self.rdzv_conf(),
            "--max-restarts",
            str(self.max_restarts),
            *(("--local-addr", self.local_addr) if self.local_addr else ()),
            "-m",
            "dmlctl.runtime.entry",
            self.script,
            *self.args,
        )

    def rdzv_conf(self) -> str:
        """torchrun's ``--rdzv-conf`` for dmlctl's rendezvous backend."""
        conf = [f"is_host={str(self.is_host).lower()}"]
        if self.run_name:
            conf.append(f"run={self.run_name}")
        if self.run_store:
            conf.append("store=run")
            if self.node_rank is not None:
                conf.append(f"node={self.node_rank}")
        return ",".join(conf)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> TorchrunCommand:
        """Inverse of :func:`dataclasses.asdict` (JSON lists become tuples)."""
        return TorchrunCommand(**{**data, "args": tuple(data.get("args", ()))})


@dataclass(frozen=True)
class StrategyChoice:
    """The job's strategy as it travels to the ranks: its name and its parameters
    (JSON data: the keys the job set, validated by the planner), always together. The
    ranks read them back from :data:`ENV_STRATEGY` and :data:`ENV_STRATEGY_PARAMS`
    (``dmlctl.runtime.env`` validates them once per process)."""

    name: str = DEFAULT_STRATEGY
    params: Mapping[str, Any] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """The two variables every rank gets."""
        return {
            ENV_STRATEGY: self.name,
            ENV_STRATEGY_PARAMS: json.dumps(dict(self.params), sort_keys=True),
        }


@dataclass(frozen=True)
class Rejoin:
    """A lost host's ranks, for another host's agent to start into the running world
    in torchrun's place (``restart.mode: in_place``; :mod:`dmlctl.agent.standin`):
    their global ranks in local-rank order, the world's size, the run's store
    (``master_addr:master_port``, as the lost ranks said torchrun gave it), the lost
    host's node rank and the number of nodes, and which replacement this is."""

    ranks: tuple[int, ...]
    world_size: int
    master_addr: str
    master_port: int
    group_rank: int
    group_world_size: int
    number: int = 1

    def standin_env(self, torchrun: TorchrunCommand) -> str:
        """The stand-in's instructions (:data:`dmlctl.agent.standin.ENV_STANDIN`, read
        by :meth:`dmlctl.agent.standin.Order.from_json`): these fields, the run's
        id, the run's restart budget and ``torchrun``'s script and arguments."""
        data = {
            "rejoin": asdict(self),
            "run_id": torchrun.run_name or torchrun.rdzv_id,
            "max_restarts": torchrun.max_restarts,
        }
        return json.dumps({**data, "script": torchrun.script, "args": list(torchrun.args)})

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Rejoin:
        """Inverse of :func:`dataclasses.asdict` (JSON lists become tuples)."""
        return Rejoin(**{**data, "ranks": tuple(int(r) for r in data["ranks"])})


@dataclass(frozen=True)
class AgentConfig:
    """What a host agent runs for one attempt: built by the planner
    (``LaunchPlan.agent_config``), sent as the first line of the agent's stdin.

    ``attempt`` counts from 0; ``rank_dir`` is this attempt's rank directory and
    ``torchrun.rdzv_id`` its rendezvous id. ``env`` is the host's planned environment;
    ``strategy`` the job's strategy with its parameters; the ranks get both through
    :meth:`rank_env`. ``stop_grace``: seconds the ranks get
    after SIGTERM when the agent stops them. ``rejoin``: the agent starts these ranks
    into the running world instead of torchrun (a lost host's, replaced in place).
    """

    run_id: str
    host: str
    attempt: int
    workdir: str
    rank_dir: str
    torchrun: TorchrunCommand
    env: Mapping[str, str] = field(default_factory=dict)
    strategy: StrategyChoice = field(default_factory=StrategyChoice)
    stop_grace: float = 30.0
    rejoin: Rejoin | None = None
    key: str = ""  # the run key (dmlctl.run_key): written to the rank directory, 0600
    masked: tuple[str, ...] = ()
    """The values the run hides: the agent masks them in its rank files once its ranks
    are gone (:mod:`dmlctl.masking`)."""

    def rank_env(self) -> dict[str, str]:
        """The variables torchrun (and so every rank) gets on top of the agent's own
        environment: ``env``, :data:`ENV_ATTEMPT` (``attempt + 1``, as the dashboard
        counts), :data:`ENV_RANK_DIR` and the strategy (:meth:`StrategyChoice.env`)."""
        return {
            **self.env,
            ENV_ATTEMPT: str(self.attempt + 1),
            ENV_RANK_DIR: self.rank_dir,
            **self.strategy.env(),
        }

    def to_json(self) -> str:
        """One line of JSON (the wire form; :meth:`from_json` reads it back)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> AgentConfig:
        """Inverse of :meth:`to_json`. Raises ``ValueError`` for anything else."""
        try:
            data = json.loads(text)
            torchrun = TorchrunCommand.from_dict(data.pop("torchrun"))
            strategy = StrategyChoice(**data.pop("strategy"))
            rejoin = data.pop("rejoin", None)
            rejoined = Rejoin.from_dict(rejoin) if rejoin is not None else None
            masked = tuple(str(v) for v in data.pop("masked", ()))
            return AgentConfig(
                **data, torchrun=torchrun, strategy=strategy, rejoin=rejoined, masked=masked
            )
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"not an agent configuration: {exc}") from exc


@dataclass(frozen=True)
class AgentRequest:
    """What a controller asks the agent server for (:mod:`dmlctl.agent.server`): the
    host agent's command line, working directory, environment and umask, as a new
    ``python -m dmlctl.agent`` would have them. One JSON message over the server's
    socket, the agent's stdin, stdout and stderr passed beside it."""

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    umask: int
    starter: int | None = None
    """A process whose end means the controller is gone, besides stdin's end: the
    remote starter (:mod:`dmlctl.agent.served`) that waits for the agent."""

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "env": dict(self.env)}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> AgentRequest:
        """The request in ``raw``; ValueError (or KeyError, TypeError) if it is not one."""
        doc = json.loads(raw)
        return cls(
            argv=tuple(str(a) for a in doc["argv"]),
            cwd=str(doc["cwd"]),
            env={str(k): str(v) for k, v in dict(doc["env"]).items()},
            umask=int(doc["umask"]),
            starter=None if doc.get("starter") is None else int(doc["starter"]),
        )
