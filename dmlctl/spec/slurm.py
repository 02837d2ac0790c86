"""A Slurm cluster's ``slurm:`` block: what dmlctl asks Slurm for (one allocation of
``nodes`` nodes) and how commands run on its nodes. Pure, no I/O: whether the
partition or account exists is for ``doctor`` and ``sbatch`` to say.

A Slurm cluster names no hosts: its hosts are the allocation's nodes, ``node-0`` …
``node-<nodes-1>`` in the plan, bound to the nodes Slurm gives when the allocation
starts.
"""

from __future__ import annotations

import re
from typing import Annotated

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

    nodes: int = Field(
        default=1,
        ge=1,
        le=MAX_HOSTS,
        description="Nodes of the allocation; each runs one dmlctl agent and the "
        "cluster's slots (defaults.slots) of workers.",
    )
    partition: str | None = Field(default=None, min_length=1, description="sbatch --partition.")
    account: str | None = Field(default=None, min_length=1, description="sbatch --account.")
    qos: str | None = Field(default=None, min_length=1, description="sbatch --qos.")
    time: str | None = Field(
        default=None,
        description="sbatch --time: the allocation's time limit (e.g. '30', '4:00:00', "
        "'1-00:00:00'); default: the partition's.",
    )
    gpus_per_node: int = Field(
        default=0, ge=0, le=1024, description="sbatch --gpus-per-node; every step gets them."
    )
    exclusive: bool = Field(default=False, description="sbatch --exclusive: whole nodes.")
    cpus_per_node: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="CPUs of each node for the run (sbatch --cpus-per-task, one task a "
        "node); default: one per worker slot (defaults.slots).",
    )
    mem: str | None = Field(
        default=None,
        description="Memory of each node for the run (sbatch --mem, e.g. '64G'; '0': all "
        "of it); default: the partition's.",
    )
    requeue: bool = Field(
        default=False,
        description="When Slurm ends the allocation early (time limit, preemption, a "
        "failed node), ask for a new one and go on from the newest checkpoint (it "
        "spends one of restart.max_infra_restarts).",
    )
    sbatch_options: list[SbatchOption] = Field(
        default_factory=list,
        max_length=100,
        description="More sbatch options, one per item ('--constraint=a100'); not one "
        "that a key above sets.",
    )
    setup: str | None = Field(
        default=None,
        description="Shell lines run before every command on a node (module load, "
        "source a venv), e.g. 'module load cuda && source ~/venv/bin/activate'.",
    )
    conf: str | None = Field(
        default=None,
        min_length=1,
        description="Slurm's configuration file (exported as SLURM_CONF to every Slurm "
        "command); default: Slurm's own (/etc/slurm/slurm.conf).",
    )

    _one_line = field_validator("partition", "account", "qos", "conf")(check_one_line)
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

    def placeholders(self) -> list[str]:
        """The plan's host names of the allocation's nodes."""
        return [placeholder(i) for i in range(self.nodes)]
