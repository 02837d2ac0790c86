"""A Slurm cluster's ``slurm:`` block: what dmlctl asks Slurm for (one allocation of
``nodes`` nodes) and how commands run on its nodes. Pure, no I/O: whether the
partition or account exists is for ``doctor`` and ``sbatch`` to say.

A Slurm cluster names no hosts: its hosts are the allocation's nodes, ``node-0`` …
``node-<n-1>`` in the plan (``n``: ``nodes``, or a range's most), bound to the nodes
Slurm gives when the allocation starts.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, field_validator

from dmlctl.spec.fields import FROZEN, MAX_HOSTS, check_command, check_one_line, one_line

SLURM_TIME = re.compile(r"^(\d+-\d{1,2}(:\d{1,2}(:\d{1,2})?)?|\d+(:\d{1,2}(:\d{1,2})?)?)$")
"""Slurm's ``--time`` forms: minutes, minutes:seconds, hours:minutes:seconds,
days-hours, days-hours:minutes, days-hours:minutes:seconds."""

MANAGED_OPTIONS = (
    "--job-name",
    "-J",
    "--nodes",
    "-N",
    "--ntasks",
    "-n",
    "--ntasks-per-node",
    "--output",
    "-o",
    "--error",
    "-e",
    "--partition",
    "-p",
    "--account",
    "-A",
    "--qos",
    "-q",
    "--time",
    "-t",
    "--gpus-per-node",
    "--exclusive",
    "--parsable",
    "--wrap",
)
"""``sbatch`` options dmlctl sets itself (from the block's own keys, or to hold the
allocation); ``sbatch_options`` may not set them again."""


def placeholder(i: int) -> str:
    """The plan's name of the allocation's ``i``-th node (0-based)."""
    return f"node-{i}"


REFUSED_OPTIONS = {
    "--wait": "sbatch would not return until the allocation ends",
    "-W": "sbatch would not return until the allocation ends",
    "--hold": "the allocation would never start",
    "-H": "the allocation would never start",
    "--array": "it would ask for more than one allocation",
    "-a": "it would ask for more than one allocation",
    "--test-only": "no allocation would be made",
    "--signal": "the holding script would end the run early",
    "--gres": "steps would not get them; use gpus_per_node",
    "--gpus": "steps would not get them; use gpus_per_node",
    "-G": "steps would not get them; use gpus_per_node",
    "--cpus-per-task": "use cpus_per_node",
    "-c": "use cpus_per_node",
    "--mem": "use mem",
    "--requeue": "dmlctl asks for a new allocation itself: use slurm.requeue",
    "--no-requeue": "dmlctl sets it",
    "--no-shell": "dmlctl holds the allocation itself (slurm.salloc)",
}
"""Options that would leave dmlctl waiting, holding more than one allocation, or
steps without what the allocation has: refused with why."""


def _check_sbatch_option(value: str) -> str:
    """One sbatch option (``--name=value``, ``--flag`` or ``-Xvalue``) that dmlctl does
    not set itself, nor an abbreviation of one (sbatch takes any unique prefix of a
    long option); ValueError saying which rule it breaks."""
    one_line(value)
    name = value.split("=", 1)[0]
    if not value.startswith("-") or any(c.isspace() for c in name):
        raise ValueError(
            f"{value!r} is not one sbatch option; write each as '--name=value' or '--flag'"
        )
    if name.startswith("--"):
        longs = [o for o in (*MANAGED_OPTIONS, *REFUSED_OPTIONS) if o.startswith("--")]
        hits = [o for o in longs if o == name] or [o for o in longs if o.startswith(name)]
        option = hits[0] if hits else name
    else:
        option = name[:2]
    if option in MANAGED_OPTIONS:
        raise ValueError(f"{option} is set by dmlctl (use the slurm block's own key for it)")
    if option in REFUSED_OPTIONS:
        raise ValueError(f"{option} is refused: {REFUSED_OPTIONS[option]}")
    return value


SbatchOption = Annotated[str, AfterValidator(_check_sbatch_option)]


class SlurmSpec(BaseModel):
    """The ``slurm:`` block of a cluster with ``scheduler: slurm`` (all optional)."""

    model_config = FROZEN

    nodes: int | str = 1
    """Nodes of the allocation, a count (4) or a range ('2-4': the run starts on as many as Slurm
    grants; the low end is the run's default min_hosts); each runs one dmlctl agent and the
    cluster's slots (defaults.slots) of workers."""
    partition: str | None = Field(default=None, min_length=1)
    """sbatch --partition."""
    account: str | None = Field(default=None, min_length=1)
    """sbatch --account."""
    qos: str | None = Field(default=None, min_length=1)
    """sbatch --qos."""
    time: str | None = None
    """sbatch --time: the allocation's time limit (e.g. '30', '4:00:00', '1-00:00:00'); default: the
    partition's."""
    gpus_per_node: int = Field(default=0, ge=0, le=1024)
    """sbatch --gpus-per-node; every step gets them."""
    exclusive: bool = False
    """sbatch --exclusive: whole nodes."""
    cpus_per_node: int | None = Field(default=None, ge=1, le=100_000)
    """CPUs of each node for the run (sbatch --cpus-per-task, one task a node); default: one per
    worker slot (defaults.slots)."""
    mem: str | None = None
    """Memory of each node for the run (sbatch --mem, e.g. '64G'; '0': all of it); default: the
    partition's."""
    requeue: bool = False
    """When Slurm ends the allocation early (time limit, preemption, a failed node), ask for a new
    one and go on from the newest checkpoint (it spends one of restart.max_infra_restarts)."""
    warn_before_end: float = Field(default=0, ge=0, le=86_400)
    """Seconds before the allocation's time limit at which dmlctl stops the ranks (SIGTERM, then
    restart.stop_grace to save), and with requeue asks for a new allocation at once; 0: Slurm's
    own SIGTERM and KillWait at the limit."""
    allocation: Literal["enclosing", "new"] = "enclosing"
    """When dmlctl itself runs inside a Slurm allocation (SLURM_JOB_ID set: an sbatch script, an
    salloc shell): 'enclosing' runs the job on that allocation's nodes (nothing is asked for, and
    the keys of a request do not apply; the allocation is left as it was at the end); 'new' asks
    for an allocation of its own all the same."""
    salloc: bool = False
    """Ask with salloc instead of sbatch (an interactive allocation, for partitions or QOS that take
    only those); its holding script runs on this machine under salloc."""
    sbatch_options: list[SbatchOption] = Field(default_factory=list, max_length=100)
    """More sbatch (or salloc) options, one per item ('--constraint=a100'); not one that a key above
    sets."""
    setup: str | None = None
    """Shell lines run before every command on a node (module load, source a venv), e.g. 'module
    load cuda && source ~/venv/bin/activate'."""
    conf: str | None = Field(default=None, min_length=1)
    """Slurm's configuration file (exported as SLURM_CONF to every Slurm command); default: Slurm's
    own (/etc/slurm/slurm.conf)."""

    _one_line = field_validator("partition", "account", "qos", "conf")(check_one_line)

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, value: object) -> int | str:
        low, high = node_range(value)
        return low if low == high else f"{low}-{high}"

    _setup = field_validator("setup")(check_command)

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9]+[KMGT]?", value):
            raise ValueError(
                f"{value!r} is no Slurm memory size: a number with K, M, G or T ('64G'; "
                "'0': all of the node's)"
            )
        return value

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not SLURM_TIME.match(value):
            raise ValueError(
                f"{value!r} is no Slurm time: minutes, 'H:MM:SS', 'D-HH', 'D-HH:MM' or 'D-HH:MM:SS'"
            )
        return value

    @property
    def min_nodes(self) -> int:
        """The fewest nodes the allocation may have (``nodes``' low end)."""
        return node_range(self.nodes)[0]

    @property
    def max_nodes(self) -> int:
        """The most nodes the allocation may have: the plan names that many hosts."""
        return node_range(self.nodes)[1]

    @property
    def is_range(self) -> bool:
        """Whether Slurm may grant fewer nodes than :attr:`max_nodes`."""
        return self.min_nodes < self.max_nodes

    def placeholders(self) -> list[str]:
        """The plan's host names of the allocation's nodes (as many as it may have)."""
        return [placeholder(i) for i in range(self.max_nodes)]


def node_range(value: object) -> tuple[int, int]:
    """``nodes`` as (fewest, most): a count ``4`` or ``'4'`` is (4, 4), a range
    ``'2-4'`` is (2, 4); ValueError unless 1 <= fewest <= most <= MAX_HOSTS."""
    if isinstance(value, int) and not isinstance(value, bool):
        low = high = value
    elif isinstance(value, str) and (m := re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", value)):
        low, high = int(m[1]), int(m[2] or m[1])
    else:
        raise ValueError(f"{value!r} is no node count: a number (4) or a range ('2-4')")
    if not 1 <= low <= high <= MAX_HOSTS:
        raise ValueError(f"{value!r}: nodes must be from 1 to {MAX_HOSTS}, a range's low end first")
    return low, high


def minutes(value: str) -> float:
    """A Slurm ``--time`` (:data:`SLURM_TIME`, already checked) in minutes."""
    days, _, rest = value.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        parts += [0] * (3 - len(parts))
        return int(days) * 1440 + parts[0] * 60 + parts[1] + parts[2] / 60
    if len(parts) == 3:  # hours:minutes:seconds
        return parts[0] * 60 + parts[1] + parts[2] / 60
    return parts[0] + (parts[1] / 60 if len(parts) == 2 else 0)  # minutes[:seconds]
