"""Job specs, and the names of every spec model.

These models do no I/O: reading files and resolving paths happen in
:mod:`dmlctl.spec.loader`. A strategy's parameters are validated here, once, into
the strategy's own ``Params`` model (its torch-free module is imported for it).
Every field carries a user-facing description; the README documents the YAML keys
from them. The cluster models live in
:mod:`dmlctl.spec.cluster` and are re-exported here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    FieldSerializationInfo,
    SerializeAsAny,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from dmlctl.protocol import DEFAULT_STRATEGY, ROLE_SERVER
from dmlctl.spec.cluster import (
    LOCAL_ADDRESS,
    ClusterSpec,
    DuplicateHost,
    HostDefaults,
    HostKey,
    HostSpec,
    ResolvedHost,
    duplicate_hosts,
)
from dmlctl.spec.fields import (
    ENV_NAME_PATTERN,
    FROZEN,
    MAX_HOSTS,
    MAX_ITEMS,
    MAX_NAME,
    MAX_WORKERS,
    NAME_PATTERN,
    RESERVED_ENV,
    Arg,
    EnvName,
    ExcludePattern,
    HostName,
    OneLine,
    SecretValue,
    check_args,
    check_command,
    check_env,
    shown,
)
from dmlctl.spec.parallelism import ParallelismSpec, split_parallelize
from dmlctl.spec.ranks import RanksSpec
from dmlctl.spec.restart import CheckpointSpec, RestartSpec, check_in_place
from dmlctl.strategies import registry

__all__ = [
    "BUILTIN_EXCLUDES",
    "ENV_NAME_PATTERN",
    "LOCAL_ADDRESS",
    "NAME_PATTERN",
    "RESERVED_ENV",
    "ClusterSpec",
    "DuplicateHost",
    "EnvName",
    "HostDefaults",
    "HostKey",
    "HostSpec",
    "JobSpec",
    "ParallelismSpec",
    "ResolvedHost",
    "StrategySpec",
    "duplicate_hosts",
]

HostCount = Annotated[int, Field(ge=1, le=MAX_HOSTS)]
"""A number of hosts a job may run on: 1 to :data:`~dmlctl.spec.fields.MAX_HOSTS`."""

BUILTIN_EXCLUDES = (".git/", "__pycache__/", "*.pyc", ".venv/", ".dmlctl/")
"""Never shipped to the hosts, whatever ``.gitignore`` and ``exclude`` say (gitignore syntax)."""


class _Unchecked(BaseModel):
    """The params of a strategy whose name is invalid (that error is the one reported)."""


class StrategySpec(BaseModel):
    """Which distributed training strategy a job uses and its parameters.

    In YAML, ``strategy: ssgd`` is shorthand for ``strategy: {name: ssgd}``. ``params``
    (a mapping) is validated into the strategy's own ``Params`` model and kept as that
    object; its errors carry key paths below ``params``.
    """

    model_config = FROZEN

    name: str = DEFAULT_STRATEGY
    """Registered strategy name (see `dmlctl strategies`)."""
    params: SerializeAsAny[BaseModel] = Field(default_factory=dict, validate_default=True)
    """Strategy parameters; each strategy documents its own."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        try:
            registry.entry(name)
        except registry.UnknownStrategy:
            valid = ", ".join(registry.names())
            hint = registry.did_you_mean(name)
            raise ValueError(f"unknown strategy {shown(name)}{hint}; valid: {valid}") from None
        return name

    @field_validator("params", mode="before")
    @classmethod
    def _typed_params(cls, params: Any, info: ValidationInfo) -> Any:
        """``params`` as the strategy's ``Params`` (strictly: no strings for numbers);
        an unknown strategy's params are left for its name's error alone."""
        name = info.data.get("name")
        if name is None:
            return _Unchecked()
        model = registry.load(name).Params
        return params if type(params) is model else model.model_validate(params, strict=True)

    @field_serializer("params")
    def _given_params(self, params: BaseModel, info: FieldSerializationInfo) -> dict[str, Any]:
        """Dumped as the job wrote them: the keys it set, whatever their values."""
        return params.model_dump(mode=info.mode, exclude_unset=True)


def uses_servers(strategy: str) -> bool:
    """Whether the registered strategy ``strategy`` runs parameter servers."""
    return ROLE_SERVER in registry.capabilities(strategy).roles


class JobSpec(BaseModel):
    """One training run (a job file): what to run, how many workers, which strategy."""

    model_config = FROZEN

    name: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=MAX_NAME)
    """Job name, used in run ids; default: the name of the job file's directory."""
    script: OneLine = Field(min_length=1)
    """Training script, relative to workdir (a regular file inside it, symbolic links resolved)."""
    args: list[Arg] = Field(default_factory=list, max_length=MAX_ITEMS)
    """Arguments passed to the script (no NUL or control characters)."""
    workers: int | None = Field(
        default=None,
        ge=1,
        le=MAX_WORKERS,
        description=f"Number of worker processes (at most {MAX_WORKERS}), or 'auto' (the "
        "default): every slot of the cluster (on this machine: one per GPU, else per core).",
    )
    strategy: StrategySpec = Field(default_factory=StrategySpec)
    """Distributed strategy: a name or {name, params}."""
    backend: Literal["auto", "nccl", "gloo", "cpu:gloo,cuda:nccl"] = "auto"
    """Process-group backend: 'auto' (the default: on a GPU rank 'cpu:gloo,cuda:nccl', CUDA tensors
    through NCCL and CPU tensors through gloo; else gloo), 'nccl' (the same),
    'cpu:gloo,cuda:nccl', or 'gloo' (everything through gloo; workers may then share GPUs). Each
    worker takes its own GPU, servers none."""
    parameter_servers: int = Field(default=0, ge=0, le=MAX_WORKERS, validate_default=True)
    """Parameter-server processes, for the strategies that use them (asgd, ssp, adadelay,
    easgd-async, sync-ps, aadmm; required there, refused elsewhere). They do not take worker
    slots. Default: 0."""
    server_hosts: list[HostName] | None = Field(default=None, min_length=1, max_length=MAX_HOSTS)
    """Cluster hosts that run only parameter servers (spread over them in turn); default: the
    servers run next to the workers, one per worker host in turn."""
    env: dict[EnvName, str] = Field(default_factory=dict)
    """Environment variables for every rank; values must be strings (quote numbers). Stored redacted
    with the run; see Secrets."""
    workdir: OneLine = Field(default=".", min_length=1)
    """Directory shipped to the hosts, relative to the job file's directory."""

    setup: str | None = None
    """Shell command run on every remote host, in the job's directory there, before the workers
    start (e.g. 'pip install -r requirements.txt'); default: none."""
    secrets: list[SecretValue] = Field(default_factory=list, max_length=MAX_ITEMS)
    """More values to show as *** wherever dmlctl stores or shows text (logs, state, plan, specs,
    the dashboard), besides those it finds itself (secret-named env values, URL passwords, values
    of secret-named flags in args, values a setup exports to secret-named variables); at least 6
    characters each. Default: none."""
    exclude: list[ExcludePattern] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description=(
            "Files not to ship to the hosts: gitignore-style patterns, in addition to "
            ".gitignore and the built-in " + ", ".join(BUILTIN_EXCLUDES) + "."
        ),
    )
    ranks: RanksSpec = Field(default_factory=RanksSpec)
    """How each rank's process starts: {start: fresh} (the default, as torchrun starts it) or
    {start: warm} (forked from a process that imported torch already)."""
    restart: RestartSpec = Field(default_factory=RestartSpec)
    """When a failed run is started again: budgets for failures of the training code and of the
    infrastructure, backoff, hang timeout."""
    checkpoint: CheckpointSpec | None = None
    """Periodic checkpoints written by ctx.checkpoint() (every N steps and/or T seconds), from which
    a restarted run resumes; default: none."""
    min_hosts: HostCount | None = None
    """Fewest hosts a restarted run may continue on after losing hosts (it re-forms with fewer
    workers); with fewer left it waits up to restart.host_wait for them, then fails. Default:
    every host of the first attempt."""
    max_hosts: HostCount | None = None
    """Most hosts the run uses at once; the cluster's other hosts stand by and replace lost ones on
    a restart. Default: as many as 'workers' needs."""
    parallelism: ParallelismSpec | None = None
    """The device mesh of each step: tensor, pipeline and FSDP2 degrees (torchtitan's keys), with
    strategy ssgd (compression none) or asgd; default: none (plain data parallelism)."""
    parallelize: OneLine | None = None
    """FILE:FUNCTION (FILE a .py file relative to workdir) that parallelizes the model over the
    device mesh; needs a parallelism: block. Default: none."""

    advice: str | None = None
    """Set by dmlctl, never in a job file: where `strategy: {name: auto, advice: FILE}` took the
    strategy from, in one line."""

    @field_validator("workers", mode="before")
    @classmethod
    def _auto_workers(cls, value: Any) -> Any:
        """``auto`` is the default: every slot of the cluster."""
        return None if value == "auto" else value

    @field_validator("parameter_servers")
    @classmethod
    def _servers_fit_strategy(cls, n: int, info: ValidationInfo) -> int:
        strategy = info.data.get("strategy")
        if not isinstance(strategy, StrategySpec):
            return n
        if uses_servers(strategy.name) and n == 0:
            raise ValueError(
                f"strategy {strategy.name!r} needs parameter servers: set parameter_servers "
                "to 1 or more"
            )
        if n > 0 and not uses_servers(strategy.name):
            with_servers = [name for name in registry.names() if uses_servers(name)]
            raise ValueError(
                f"strategy {strategy.name!r} has no parameter servers; remove "
                f"parameter_servers or use one of: {', '.join(with_servers)}"
            )
        return n

    @field_validator("server_hosts")
    @classmethod
    def _server_hosts_need_servers(
        cls, hosts: list[str] | None, info: ValidationInfo
    ) -> list[str] | None:
        strategy = info.data.get("strategy")
        if not isinstance(strategy, StrategySpec) or hosts is None:
            return hosts
        if not uses_servers(strategy.name):
            raise ValueError(
                f"strategy {strategy.name!r} has no parameter servers to place; remove server_hosts"
            )
        return hosts

    @field_validator("restart")
    @classmethod
    def _in_place_fits_strategy(cls, spec: RestartSpec, info: ValidationInfo) -> RestartSpec:
        strategy = info.data.get("strategy")
        if spec.mode == "in_place" and isinstance(strategy, StrategySpec):
            check_in_place(strategy.name, strategy.params)
        return spec

    @field_validator("parallelism")
    @classmethod
    def _not_in_place(cls, value: Any, info: ValidationInfo) -> Any:
        restart = info.data.get("restart")
        if value is not None and isinstance(restart, RestartSpec) and restart.mode == "in_place":
            raise ValueError(
                "does not combine with restart.mode: in_place yet (a replaced worker "
                "cannot join the workers' collectives); remove it or use mode: full"
            )
        return value

    @field_validator("max_hosts")
    @classmethod
    def _host_bounds(cls, high: int | None, info: ValidationInfo) -> int | None:
        low = info.data.get("min_hosts")
        if low is not None and high is not None and low > high:
            raise ValueError(f"is smaller than min_hosts ({low})")
        return high

    @field_validator("parallelism")
    @classmethod
    def _parallelism_fits_strategy(
        cls, spec: ParallelismSpec | None, info: ValidationInfo
    ) -> ParallelismSpec | None:
        strategy = info.data.get("strategy")
        if spec is not None and isinstance(strategy, StrategySpec):
            spec.check_strategy(strategy.name, strategy.params)
        return spec

    @field_validator("parallelize")
    @classmethod
    def _parallelize_function(cls, value: str | None, info: ValidationInfo) -> str | None:
        """``FILE:FUNCTION``, and only with a ``parallelism:`` block (the file itself
        is checked by the loader, which reads the disk)."""
        if value is None:
            return None
        split_parallelize(value)
        if "parallelism" in info.data and info.data["parallelism"] is None:
            raise ValueError(
                "needs a parallelism: block (the device mesh the function parallelizes "
                "the model over)"
            )
        return value

    _env = field_validator("env")(check_env)
    _args = field_validator("args")(check_args)
    _setup = field_validator("setup")(check_command)
