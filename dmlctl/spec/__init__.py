"""Cluster and job specs: frozen models and the loader that reports every issue at once.

``load_job`` / ``load_cluster`` read YAML files, ``load_hostfile`` reads a
DeepSpeed/MPI hostfile and ``load_cluster_file`` picks between the two; all raise
:class:`dmlctl.errors.SpecError` with ``file:line key.path: message`` issues.
``default_cluster`` is this machine.
"""

from dmlctl.spec.hostfile import load_cluster_file, load_hostfile
from dmlctl.spec.loader import load_cluster, load_job, with_rank_start, with_workers
from dmlctl.spec.local import count_local_gpus, default_cluster
from dmlctl.spec.models import (
    BUILTIN_EXCLUDES,
    ClusterSpec,
    HostDefaults,
    HostSpec,
    JobSpec,
    ResolvedHost,
    StrategySpec,
)

__all__ = [
    "BUILTIN_EXCLUDES",
    "ClusterSpec",
    "HostDefaults",
    "HostSpec",
    "JobSpec",
    "ResolvedHost",
    "StrategySpec",
    "count_local_gpus",
    "default_cluster",
    "load_cluster",
    "load_cluster_file",
    "load_hostfile",
    "load_job",
    "with_rank_start",
    "with_workers",
]
