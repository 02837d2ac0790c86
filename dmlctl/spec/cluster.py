"""Cluster specs: the hosts a job runs on, as frozen, typed data validated once.

No I/O here: whether an ``identity_file`` exists, and where a relative one points,
is checked by :mod:`dmlctl.spec.loader`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from dmlctl.spec.fields import (
    FROZEN,
    MAX_HOSTS,
    MAX_NAME,
    MAX_SLOTS,
    NAME_PATTERN,
    EnvName,
    check_env,
    check_host_text,
    check_one_line,
    check_python,
    check_user,
    is_host_text,
)
from dmlctl.spec.slurm import SlurmSpec, node_range, placeholder

LOCAL_ADDRESS = "localhost"
"""The one address reached without SSH."""

_WORKDIR_HELP = " On a remote host: absolute, '~/...', or relative to the SSH login directory."


class HostDefaults(BaseModel):
    """Values every host of a cluster gets unless the host sets its own."""

    model_config = FROZEN

    port: int = Field(default=22, ge=1, le=65535)
    """SSH port."""
    user: str | None = Field(default=None, min_length=1)
    """SSH user; default: your SSH config / login name."""
    identity_file: str | None = Field(default=None, min_length=1)
    """Private key file for SSH ('~' expanded; relative to the cluster file's directory); default:
    ssh-agent/SSH config."""
    slots: int = Field(
        default=1,
        ge=1,
        le=MAX_SLOTS,
        description=f"Worker processes per host (e.g. its GPU count); at most {MAX_SLOTS}.",
    )
    workdir: str = Field(
        default="~/.dmlctl/work",
        min_length=1,
        description="Directory on the host where dmlctl puts the job's code and run files."
        + _WORKDIR_HELP,
    )
    python: str = Field(default="python3", min_length=1)
    """Python interpreter on the host (with torch)."""
    env: dict[EnvName, str] = Field(default_factory=dict)
    """Environment variables for every process on the host."""

    _env = field_validator("env")(check_env)
    _user = field_validator("user")(check_user)
    _python = field_validator("python")(check_python)
    _one_line = field_validator("identity_file", "workdir")(check_one_line)


class HostSpec(BaseModel):
    """One machine of a cluster. Unset values come from the cluster's ``defaults``."""

    model_config = FROZEN

    name: str = ""
    """Name shown in logs and the dashboard; unique per cluster; default: address. Letters, digits,
    '.', '-', '_', ':' (it names files of the run)."""
    address: str = Field(min_length=1)
    """Host name, SSH config alias or IP address. Only 'localhost' runs without SSH; every other
    address (even 127.0.0.1) is reached over SSH."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """SSH port; default: defaults.port (22)."""
    user: str | None = Field(default=None, min_length=1)
    """SSH user; default: defaults.user."""
    identity_file: str | None = Field(default=None, min_length=1)
    """Private key file for SSH ('~' expanded; relative to the cluster file's directory); default:
    defaults.identity_file."""
    slots: int | None = Field(default=None, ge=1, le=MAX_SLOTS)
    """Worker processes on this host; default: defaults.slots."""
    workdir: str | None = Field(
        default=None,
        min_length=1,
        description="Directory for the job's code on this host; default: defaults.workdir."
        + _WORKDIR_HELP,
    )
    python: str | None = Field(default=None, min_length=1)
    """Python interpreter on this host; default: defaults.python."""
    env: dict[EnvName, str] = Field(default_factory=dict)
    """Environment variables for this host, merged over defaults.env."""

    _env = field_validator("env")(check_env)
    _user = field_validator("user")(check_user)
    _python = field_validator("python")(check_python)
    _one_line = field_validator("identity_file", "workdir")(check_one_line)

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        # `name` is typed `str` so that `.name` is always usable; fill it from the
        # address before validation, leaving a missing address for pydantic to report.
        # An address that is no host name is reported once, at `address`.
        if (
            isinstance(data, dict)
            and data.get("name") is None
            and is_host_text(data.get("address"))
        ):
            return {**data, "name": data["address"]}
        return data

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return check_host_text(value, "address")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_host_text(value, "host name")

    @property
    def is_local(self) -> bool:
        """True when the host is this machine and is reached without SSH (``localhost``)."""
        return self.address == LOCAL_ADDRESS


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


@dataclass(frozen=True)
class HostKey:
    """What makes a host distinct: its name, and where SSH connects to.

    ``None`` stands for a value that is missing or invalid (it matches nothing).
    """

    name: str | None
    address: str | None
    port: int | None


@dataclass(frozen=True)
class DuplicateHost:
    """Host ``index`` repeats host ``other``: by ``name``, or by address and port."""

    index: int
    field: Literal["name", "address"]
    other: int
    message: str


def duplicate_hosts(keys: Sequence[HostKey]) -> list[DuplicateHost]:
    """Every host that repeats an earlier one, reported at the later host.

    A repeated name is reported at ``name``. Otherwise a repeated (address, port) is
    reported at ``address`` (addresses compared case-insensitively, as DNS and ssh do).
    ``localhost`` is exempt from the address check: it is reached without SSH, and
    several local hosts are how one machine stands in for several nodes. Used by
    :class:`ClusterSpec` and by the loader (which also checks raw data when other
    host errors keep pydantic from running the model's own check).
    """
    names: dict[str, int] = {}
    places: dict[tuple[str, int], int] = {}
    found: list[DuplicateHost] = []
    for index, key in enumerate(keys):
        if key.name is not None:
            if key.name in names:
                other = names[key.name]
                found.append(DuplicateHost(index, "name", other, _name_message(key.name, other)))
                continue
            names[key.name] = index
        if key.address is None or key.port is None or key.address == LOCAL_ADDRESS:
            continue
        place = (key.address.lower(), key.port)
        if place in places:
            other = places[place]
            message = f"duplicate host: same address and port as hosts[{other}]"
            found.append(DuplicateHost(index, "address", other, message))
        else:
            places[place] = index
    return found


def _refuse(kind: str, loc: tuple[str, ...], message: str, value: object) -> None:
    """Raise the ValidationError of one cluster-level problem at ``loc``."""
    error = InitErrorDetails(type=PydanticCustomError(kind, message), loc=loc, input=value)
    raise ValidationError.from_exception_data("ClusterSpec", [error])


def _name_message(name: str, other: int) -> str:
    # Braces would be read as a template by PydanticCustomError.
    shown = name.replace("{", "(").replace("}", ")")
    return f"duplicate host name {shown!r} (also hosts[{other}]); give each host a distinct name"


class NetworkSpec(BaseModel):
    """Where the run's listeners may be reached from."""

    model_config = FROZEN

    allow_public: bool = False
    """Let a host's address be a public one (reachable from the internet). The run's store and
    rendezvous then listen where anyone on the way can reach them; dmlctl warns at every launch.
    Default: false (a public address is refused; use a private network or a VPN)."""


def public_address(address: str) -> bool:
    """Whether ``address`` is a literal IP address reachable from the internet (not
    private, loopback, link-local or reserved); a name is not judged here."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    return ip.is_global


class ClusterSpec(BaseModel):
    """The machines a job runs on (a cluster file or a hostfile).

    Host names are unique, and no two non-local hosts share an address and SSH port.
    """

    model_config = FROZEN

    name: str = Field(default="default", pattern=NAME_PATTERN, max_length=MAX_NAME)
    """Name of the cluster."""
    defaults: HostDefaults = Field(default_factory=HostDefaults)
    """Values for every host that does not set its own."""
    hosts: list[HostSpec] = Field(
        min_length=1,
        max_length=MAX_HOSTS,
        description=f"The machines; 1 to {MAX_HOSTS}. A Slurm cluster names none: its "
        "hosts are its allocation's nodes.",
    )
    scheduler: Literal["ssh", "slurm"] = "ssh"
    """How the hosts are reached: 'ssh' (the hosts listed; 'localhost' without SSH) or 'slurm' (one
    allocation of slurm.nodes nodes, commands through srun)."""
    slurm: SlurmSpec | None = None
    """What to ask Slurm for, with scheduler: slurm."""
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    """Where the run's listeners may be reached from: {allow_public: false} (the default) refuses
    a host at a public address."""

    @model_validator(mode="before")
    @classmethod
    def _slurm_hosts(cls, data: Any) -> Any:
        # A Slurm cluster's hosts are its allocation's nodes (node-0 … node-<n-1>),
        # bound when the allocation starts; a list the user wrote is refused after.
        if not isinstance(data, dict) or data.get("scheduler") != "slurm" or "hosts" in data:
            return data
        block = data.get("slurm") or {}
        try:
            nodes = node_range(block.get("nodes", 1) if isinstance(block, dict) else 1)[1]
        except ValueError:
            nodes = 1  # the slurm block's own check reports it
        return {
            **data,
            "hosts": [{"name": placeholder(i), "address": placeholder(i)} for i in range(nodes)],
        }

    @model_validator(mode="after")
    def _slurm_block(self) -> ClusterSpec:
        if self.slurm is not None and self.scheduler != "slurm":
            why = "a slurm block needs 'scheduler: slurm' (it would be ignored)"
            _refuse("slurm_block", ("slurm",), why, self.slurm)
        if self.scheduler == "slurm":
            names = (self.slurm or SlurmSpec()).placeholders()
            if [h.name for h in self.hosts] != names or any(
                h.address != h.name for h in self.hosts
            ):
                why = (
                    "a Slurm cluster's hosts are its allocation's nodes; remove 'hosts' "
                    "and set slurm.nodes"
                )
                _refuse("slurm_hosts", ("hosts",), why, self.hosts)
        return self

    @property
    def slurm_spec(self) -> SlurmSpec | None:
        """The Slurm request of a Slurm cluster (its block, or the defaults); None for SSH."""
        if self.scheduler != "slurm":
            return None
        return self.slurm or SlurmSpec()

    @model_validator(mode="after")
    def _private_hosts(self) -> ClusterSpec:
        if self.network.allow_public:
            return self
        errors = [
            InitErrorDetails(
                type=PydanticCustomError(
                    "public_address",
                    f"{h.address} is a public address: the run's store and rendezvous would "
                    "listen where anyone can reach them; use the hosts' private addresses "
                    "(or a VPN), or set network.allow_public: true in the cluster file",
                ),
                loc=("hosts", i, "address"),
                input=h.address,
            )
            for i, h in enumerate(self.hosts)
            if public_address(h.address)
        ]
        if errors:
            raise ValidationError.from_exception_data("ClusterSpec", errors)
        return self

    @model_validator(mode="after")
    def _unique_hosts(self) -> ClusterSpec:
        port = self.defaults.port
        keys = [HostKey(h.name, h.address, h.port or port) for h in self.hosts]
        errors = [
            InitErrorDetails(
                type=PydanticCustomError("duplicate_host", d.message),
                loc=("hosts", d.index, d.field),
                input=getattr(self.hosts[d.index], d.field),
            )
            for d in duplicate_hosts(keys)
        ]
        if errors:
            raise ValidationError.from_exception_data("ClusterSpec", errors)
        return self

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

    def unset_slots(self) -> tuple[str, ...]:
        """The hosts whose ``slots`` neither the host nor ``defaults`` sets (a GPU
        host's then come from its GPU count, see :meth:`with_slots`)."""
        if "slots" in self.defaults.model_fields_set:
            return ()
        return tuple(h.name for h in self.hosts if h.slots is None)

    def with_slots(self, slots: Mapping[str, int]) -> ClusterSpec:
        """This cluster with the slots of the hosts named in ``slots`` set to those."""
        hosts = [
            h.model_copy(update={"slots": slots[h.name]}) if h.name in slots else h
            for h in self.hosts
        ]
        return self.model_copy(update={"hosts": hosts})

    def granted(self, nodes: int) -> ClusterSpec:
        """This Slurm cluster with the hosts of an allocation that has ``nodes`` nodes
        (its first ``nodes`` placeholders; ``slurm.nodes`` may be a range). Not
        validated again: it has fewer hosts than ``slurm.placeholders()`` on purpose,
        for planning only (a run records the cluster file as written)."""
        return self.model_copy(update={"hosts": self.hosts[:nodes]})

    @property
    def total_slots(self) -> int:
        """Sum of the slots of all hosts: the default number of workers."""
        return sum(h.slots for h in self.resolved_hosts())
