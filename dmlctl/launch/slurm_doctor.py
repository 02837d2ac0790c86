"""``dmlctl doctor`` on a Slurm cluster: what ``sinfo`` says of the partition, then a
short allocation of the cluster's request (Slurm refusing the partition, account or
QOS is the user's error, exit 2) in which every node gets the doctor's usual checks
(Python, torch, packages, disk, clock, the rendezvous port and its reachability)
through ``srun`` steps. The allocation ends with the doctor."""

from __future__ import annotations

import dataclasses
import sys

from rich.console import Console

from dmlctl.errors import PlanError
from dmlctl.launch.slurm_scheduler import ask
from dmlctl.plan.placing import as_run
from dmlctl.provision.doctor import DoctorReport, run_doctor
from dmlctl.slurm import allocation
from dmlctl.slurm.commands import SlurmRefused
from dmlctl.slurm.info import partition_said
from dmlctl.slurm.transport import transports_for
from dmlctl.spec.models import ClusterSpec
from dmlctl.spec.slurm import SlurmSpec, minutes
from dmlctl.text import plural
from dmlctl.transport import close_transports

DOCTOR_MINUTES = 10
"""The doctor's allocation asks for at most this time limit (it takes a minute)."""


def short_request(spec: SlurmSpec) -> SlurmSpec:
    """``spec`` for the doctor: at most :data:`DOCTOR_MINUTES` long, never requeued."""
    time = spec.time
    if time is None or not 0 < minutes(time) <= DOCTOR_MINUTES:  # '0': no limit at all
        time = str(DOCTOR_MINUTES)
    return spec.model_copy(update={"time": time, "requeue": False})


def doctor_on_slurm(cluster: ClusterSpec, rdzv_port: int, err: Console) -> DoctorReport:
    """Check the Slurm ``cluster`` (see the module docstring), said on ``err`` as it
    goes; the report of every node Slurm granted. A partition, account or option
    Slurm refuses raises PlanError at its key."""
    spec = cluster.slurm_spec
    assert spec is not None, "a Slurm cluster"
    try:
        said = partition_said(spec.partition, spec.conf)
    except SlurmRefused as e:
        raise PlanError("cluster", ("slurm", "partition"), str(e)) from None
    err.print(f"Slurm {said}", markup=False)
    hosts = cluster.resolved_hosts()
    slots = max(h.slots for h in hosts)
    asked: list[str] = []  # the job id, as soon as Slurm gives it
    try:
        names = [h.name for h in hosts]
        where, addresses = ask(short_request(spec), "doctor", names, slots, err, asked.append)
    except BaseException:
        for job_id in asked:  # interrupted between the grant and the report: not kept
            allocation.cancel(job_id, spec.conf)
        raise
    try:
        bound = [
            dataclasses.replace(h, address=addresses[where.nodes[h.name]])
            for h in hosts
            if h.name in where.nodes
        ]
        bound = [as_run(h, sys.executable) for h in bound]
        transports = transports_for(bound, where)
        try:
            with err.status(f"checking {plural(len(bound), 'node')} through srun…"):
                return run_doctor(bound, transports, rdzv_port=rdzv_port)
        finally:
            close_transports(transports)
    finally:
        allocation.finish(where)
