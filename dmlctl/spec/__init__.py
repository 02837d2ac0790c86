"""Cluster and job specs: frozen models and the loader that reports every issue at once.

``load_job`` / ``load_cluster`` read YAML files and raise :class:`dmlctl.errors.SpecError`
with ``file:line key.path: message`` issues; ``default_cluster`` is this machine.
"""

from dmlctl.spec.loader import (
    count_local_gpus,
    default_cluster,
    load_cluster,
    load_job,
    with_workers,
)
from dmlctl.spec.models import (
    ClusterSpec,
    HostDefaults,
    HostSpec,
    JobSpec,
    ResolvedHost,
    StrategySpec,
)

__all__ = [
    "ClusterSpec",
    "HostDefaults",
    "HostSpec",
    "JobSpec",
    "ResolvedHost",
    "StrategySpec",
    "count_local_gpus",
    "default_cluster",
    "load_cluster",
    "load_job",
    "with_workers",
]
