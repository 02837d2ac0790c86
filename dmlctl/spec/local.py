"""The cluster used without a cluster file: this machine, sized without importing torch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dmlctl.checkpoint_claim import unusable, where
from dmlctl.spec.cluster import LOCAL_ADDRESS, ClusterSpec, HostSpec

if TYPE_CHECKING:
    from dmlctl.spec.models import JobSpec

PROC_NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
"""One entry per GPU the NVIDIA driver sees (Linux)."""

_UUID_PREFIXES = ("GPU-", "MIG-")


def default_cluster() -> ClusterSpec:
    """The cluster used when no cluster file is given: this machine, without SSH.

    One host named ``local`` at ``localhost`` with one slot per GPU when the NVIDIA
    driver reports GPUs (counted by :func:`count_local_gpus`, without importing
    torch), otherwise one slot per CPU core this process may run on.
    """
    slots = count_local_gpus() or _usable_cpus()
    return ClusterSpec(hosts=[HostSpec(name="local", address=LOCAL_ADDRESS, slots=slots)])


def local_cluster_for(workers: int | None) -> tuple[ClusterSpec, str | None]:
    """:func:`default_cluster` for a job asking for ``workers``: when that is more
    than this machine's slots, the one host gets ``workers`` slots (oversubscribed, as
    torchrun allows) and the second value says so, for a warning; else None."""
    cluster = default_cluster()
    slots = cluster.hosts[0].slots or 1
    if workers is None or workers <= slots:
        return cluster, None
    unit = "GPU" if count_local_gpus() else "core"
    host = cluster.hosts[0].model_copy(update={"slots": workers})
    note = (
        f"{workers} workers on this machine's {slots} {unit}{'s' * (slots != 1)}: "
        f"oversubscribed, the workers share them"
    )
    return cluster.model_copy(update={"hosts": [host]}), note


def count_local_gpus(
    environ: Mapping[str, str] | None = None, proc_gpus: str | os.PathLike[str] = PROC_NVIDIA_GPUS
) -> int:
    """Number of NVIDIA GPUs this process may use, without importing torch or CUDA.

    Counts the entries of ``/proc/driver/nvidia/gpus`` (0 when it does not exist). If
    ``CUDA_VISIBLE_DEVICES`` is set, counts its entries the way CUDA reads them: up to
    the first one that is not a valid index or a ``GPU-``/``MIG-`` UUID, duplicates
    once, never more than the driver reports (``""`` or ``-1`` means none).
    """
    try:
        physical = len(os.listdir(proc_gpus))
    except OSError:
        return 0
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return physical
    seen: set[str] = set()
    for item in (part.strip() for part in visible.split(",")):
        valid_index = item.isdigit() and int(item) < physical
        if not (valid_index or item.startswith(_UUID_PREFIXES)):
            break
        seen.add(str(int(item)) if valid_index else item)
    return min(len(seen), physical)


def _usable_cpus() -> int:
    # Affinity honours taskset/cgroup cpusets; cpu_count() is the whole machine.
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def local_gpu_counts(job: JobSpec, cluster: ClusterSpec) -> dict[str, int]:
    """This machine's GPU count for each of the cluster's hosts on it, as its ranks
    will see them (the job's and the host's environment may hide some)."""
    return {
        h.name: count_local_gpus({**os.environ, **job.env, **h.env})
        for h in cluster.resolved_hosts()
        if h.is_local
    }


def local_checkpoint_problem(job: JobSpec, cluster: ClusterSpec) -> str | None:
    """Why the job's ``checkpoint.dir`` cannot be a checkpoint directory on this machine,
    when the cluster has hosts here: a system directory, a relative one included once
    put under the job's ``workdir`` (where the ranks run), or a file
    (:func:`dmlctl.checkpoint_claim.unusable`). None when it can, or is not named."""
    spec = job.checkpoint
    if spec is None or spec.dir is None or not any(h.is_local for h in cluster.resolved_hosts()):
        return None
    return unusable(where(spec.dir, job.workdir))
