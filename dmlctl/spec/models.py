"""Cluster and job specs: frozen, typed data validated once.

These models do no I/O: reading files, resolving paths and validating strategy
parameters (which imports the strategy's module) happen in
:mod:`dmlctl.spec.loader`. Every field carries a user-facing description; the
README documents the YAML keys from them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from dmlctl.strategies import registry

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN)]
"""A valid environment variable name: letters, digits and ``_``, not starting with a digit."""

RESERVED_ENV = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
)
"""Variables dmlctl sets for every rank; a spec may not override them (nor ``DMLCTL_*``)."""

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""Job and cluster names: they become parts of run ids and directory names."""

HOST_NAME_PATTERN = r"^[^\s/]+$"
"""Host names: anything without whitespace or '/' (addresses, IPv6 included, qualify)."""

_HOST_TEXT = re.compile(r"^[^\s-][^\s]*$")

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def _check_env(env: dict[str, str]) -> dict[str, str]:
    errors = [
        InitErrorDetails(
            type=PydanticCustomError(
                "reserved_env", "{key} is set by dmlctl for every rank; remove it", {"key": key}
            ),
            loc=(key,),
            input=key,
        )
        for key in env
        if key in RESERVED_ENV or key.startswith("DMLCTL_")
    ]
    if errors:
        raise ValidationError.from_exception_data("env", errors)
    return env


def _check_host_text(value: str, what: str) -> str:
    # Addresses and user names end up in ssh connections and command lines; a leading
    # "-" would read as an option and whitespace as a second argument.
    if not _HOST_TEXT.match(value):
        raise ValueError(f"not a valid {what}: no spaces, must not start with '-'")
    return value


def _check_user(value: str | None) -> str | None:
    return None if value is None else _check_host_text(value, "user name")


def duplicate_host_names(names: Sequence[str | None]) -> list[tuple[int, str, int]]:
    """``(index, name, first index)`` for every host whose name an earlier host has.

    ``None`` entries (hosts without a usable name) are skipped. Used by
    :class:`ClusterSpec` and by the loader, which also checks names when other host
    errors keep pydantic from running the model's own check.
    """
    first: dict[str, int] = {}
    found: list[tuple[int, str, int]] = []
    for index, name in enumerate(names):
        if name is None:
            continue
        if name in first:
            found.append((index, name, first[name]))
        else:
            first[name] = index
    return found


def duplicate_host_message(name: str, other: int) -> str:
    """The message for a host named like ``hosts[other]``."""
    # Braces would be read as a template by PydanticCustomError.
    shown = name.replace("{", "(").replace("}", ")")
    return f"duplicate host name {shown!r} (also hosts[{other}]); give each host a distinct name"


class HostDefaults(BaseModel):
    """Values every host of a cluster gets unless the host sets its own."""

    model_config = _FROZEN

    port: int = Field(default=22, ge=1, le=65535, description="SSH port.")
    user: str | None = Field(
        default=None, min_length=1, description="SSH user; default: your SSH config / login name."
    )
    identity_file: str | None = Field(
        default=None,
        min_length=1,
        description="Private key file for SSH; default: ssh-agent/SSH config.",
    )
    slots: int = Field(
        default=1, ge=1, description="Worker processes per host (e.g. its GPU count)."
    )
    workdir: str = Field(
        default="~/.dmlctl/work",
        min_length=1,
        description="Directory on the host where dmlctl puts the job's code and run files.",
    )
    python: str = Field(
        default="python3", min_length=1, description="Python interpreter on the host (with torch)."
    )
    env: dict[EnvName, str] = Field(
        default_factory=dict, description="Environment variables for every process on the host."
    )

    _env = field_validator("env")(_check_env)

    _user = field_validator("user")(_check_user)


class HostSpec(BaseModel):
    """One machine of a cluster. Unset values come from the cluster's ``defaults``."""

    model_config = _FROZEN

    name: str = Field(
        default="",
        pattern=HOST_NAME_PATTERN,
        description="Name shown in logs and the dashboard; unique per cluster; default: address.",
    )
    address: str = Field(
        min_length=1,
        description=(
            "Host name or IP address. Only 'localhost' runs without SSH; every other "
            "address (even 127.0.0.1) is reached over SSH."
        ),
    )
    port: int | None = Field(
        default=None, ge=1, le=65535, description="SSH port; default: defaults.port (22)."
    )
    user: str | None = Field(
        default=None, min_length=1, description="SSH user; default: defaults.user."
    )
    identity_file: str | None = Field(
        default=None,
        min_length=1,
        description="Private key file for SSH; default: defaults.identity_file.",
    )
    slots: int | None = Field(
        default=None, ge=1, description="Worker processes on this host; default: defaults.slots."
    )
    workdir: str | None = Field(
        default=None,
        min_length=1,
        description="Directory for the job's code on this host; default: defaults.workdir.",
    )
    python: str | None = Field(
        default=None,
        min_length=1,
        description="Python interpreter on this host; default: defaults.python.",
    )
    env: dict[EnvName, str] = Field(
        default_factory=dict,
        description="Environment variables for this host, merged over defaults.env.",
    )

    _env = field_validator("env")(_check_env)

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        # `name` is typed `str` so that `.name` is always usable; fill it from the
        # address before validation, leaving a missing address for pydantic to report.
        if (
            isinstance(data, dict)
            and data.get("name") is None
            and isinstance(data.get("address"), str)
            and data["address"]
        ):
            return {**data, "name": data["address"]}
        return data

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return _check_host_text(value, "address")

    _user = field_validator("user")(_check_user)

    @property
    def is_local(self) -> bool:
        """True when the host is this machine and is reached without SSH (``localhost``)."""
        return self.address == "localhost"


@dataclass(frozen=True)
class ResolvedHost:
    """A host with its cluster defaults applied: every value is final."""

    name: str
    address: str
    port: int
    user: str | None
    identity_file: str | None
    slots: int
    workdir: str
    python: str
    env: Mapping[str, str]
    is_local: bool


class ClusterSpec(BaseModel):
    """The machines a job runs on (a cluster file)."""

    model_config = _FROZEN

    name: str = Field(default="default", pattern=NAME_PATTERN, description="Name of the cluster.")
    defaults: HostDefaults = Field(
        default_factory=HostDefaults, description="Values for every host that does not set its own."
    )
    hosts: list[HostSpec] = Field(min_length=1, description="The machines; at least one.")

    @field_validator("hosts")
    @classmethod
    def _unique_names(cls, hosts: list[HostSpec]) -> list[HostSpec]:
        errors = [
            InitErrorDetails(
                type=PydanticCustomError("duplicate_host", duplicate_host_message(name, other)),
                loc=(index, "name"),
                input=name,
            )
            for index, name, other in duplicate_host_names([h.name for h in hosts])
        ]
        if errors:
            raise ValidationError.from_exception_data("hosts", errors)
        return hosts

    def resolved_hosts(self) -> tuple[ResolvedHost, ...]:
        """Every host, in file order, with host values overriding ``defaults`` (env merged)."""
        d = self.defaults
        return tuple(
            ResolvedHost(
                name=h.name,
                address=h.address,
                port=h.port if h.port is not None else d.port,
                user=h.user if h.user is not None else d.user,
                identity_file=h.identity_file if h.identity_file is not None else d.identity_file,
                slots=h.slots if h.slots is not None else d.slots,
                workdir=h.workdir if h.workdir is not None else d.workdir,
                python=h.python if h.python is not None else d.python,
                env={**d.env, **h.env},
                is_local=h.is_local,
            )
            for h in self.hosts
        )

    @property
    def total_slots(self) -> int:
        """Sum of the slots of all hosts: the default number of workers."""
        return sum(h.slots for h in self.resolved_hosts())


class StrategySpec(BaseModel):
    """Which distributed training strategy a job uses and its parameters.

    In YAML, ``strategy: ssgd`` is shorthand for ``strategy: {name: ssgd}``. ``params``
    are checked against the strategy's own parameter model by the loader.
    """

    model_config = _FROZEN

    name: str = Field(
        default="ssgd", description="Registered strategy name (see `dmlctl strategies`)."
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="Strategy parameters; each strategy documents its own."
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        try:
            registry.entry(name)
        except registry.UnknownStrategy as exc:
            raise ValueError(str(exc)) from None
        return name


class JobSpec(BaseModel):
    """One training run (a job file): what to run, how many workers, which strategy."""

    model_config = _FROZEN

    name: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="Job name, used in run ids; default: the name of the job file's directory.",
    )
    script: str = Field(min_length=1, description="Training script, relative to workdir.")
    args: list[str] = Field(default_factory=list, description="Arguments passed to the script.")
    workers: int | None = Field(
        default=None,
        ge=1,
        description="Number of worker processes; default: all slots of the cluster.",
    )
    strategy: StrategySpec = Field(
        default_factory=StrategySpec, description="Distributed strategy: a name or {name, params}."
    )
    env: dict[EnvName, str] = Field(
        default_factory=dict,
        description="Environment variables for every rank; values must be strings (quote numbers).",
    )
    workdir: str = Field(
        default=".",
        min_length=1,
        description="Directory shipped to the hosts, relative to the job file's directory.",
    )

    _env = field_validator("env")(_check_env)
