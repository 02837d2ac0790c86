"""The record of a running lab (``<lab dir>/lab.json``), written by ``up`` and read by
``status``; and the cluster file ``up`` writes for ``dmlctl launch --cluster``."""

from __future__ import annotations

import getpass
import sys
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict

from dmlctl.lab.net import address
from dmlctl.lab.rates import show_rate
from dmlctl.lab.sshd import USER_KEY, host_dir

RECORD = "lab.json"
CLUSTER = "cluster.yaml"


class LabHost(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    namespace: str
    address: str
    sshd_pid: int


class LabRecord(BaseModel):
    """What ``up`` made: hosts, their link's rate and delay."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hosts: list[LabHost]
    bandwidth_bits: int
    latency_ms: float | None
    slots: int

    @property
    def bandwidth(self) -> str:
        return show_rate(self.bandwidth_bits)


def read_record(lab_dir: Path) -> LabRecord | None:
    """The lab's record, or None when there is none (or it cannot be read)."""
    try:
        return LabRecord.model_validate_json((lab_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_record(lab_dir: Path, record: LabRecord) -> None:
    (lab_dir / RECORD).write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")


def write_cluster(lab_dir: Path, record: LabRecord) -> Path:
    """``<lab dir>/cluster.yaml``: every lab host over SSH as this user with the lab's
    key, ``slots`` each, this Python (the filesystem is shared), gloo on ``eth0``."""
    doc = {
        "name": "lab",
        "defaults": {
            "user": getpass.getuser(),
            "identity_file": str(lab_dir / USER_KEY),
            "slots": record.slots,
            "python": sys.executable,
            "env": {"GLOO_SOCKET_IFNAME": "eth0"},
        },
        "hosts": [
            {
                "name": f"lab-{i}",
                "address": address(i),
                "port": 22,
                "workdir": str(host_dir(lab_dir, i) / "work"),
            }
            for i in range(len(record.hosts))
        ],
    }
    head = (
        f"# dmlctl lab: {len(record.hosts)} hosts, {record.bandwidth} each way per host"
        + (f", {record.latency_ms:g} ms delay" if record.latency_ms else "")
        + "\n# `dmlctl lab down` removes the lab and this file.\n"
    )
    path = lab_dir / CLUSTER
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


SLURM_CLUSTER = "slurm.yaml"


def write_slurm_cluster(lab_dir: Path, n: int, slots: int, conf: Path) -> Path:
    """``<lab dir>/slurm.yaml``: the lab's Slurm (``n`` nodes of ``slots`` slots, this
    Python, one work directory that every node sees, as on a cluster's shared home)."""
    doc = {
        "name": "lab-slurm",
        "scheduler": "slurm",
        "slurm": {"nodes": n, "partition": "lab", "conf": str(conf)},
        "defaults": {
            "slots": slots,
            "python": sys.executable,
            "workdir": str(lab_dir / "slurm-work"),
            "env": {"GLOO_SOCKET_IFNAME": "eth0"},
        },
    }
    head = (
        f"# dmlctl lab: Slurm over its {n} hosts (partition lab)\n"
        "# `dmlctl lab down` removes the lab and this file.\n"
    )
    path = lab_dir / SLURM_CLUSTER
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path
