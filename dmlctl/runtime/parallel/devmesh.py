"""The ``DeviceMesh`` of a layout, over the workers' global ranks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh

from dmlctl.mesh import MeshLayout


def build_mesh(layout: MeshLayout, workers: Sequence[int], device_type: str) -> DeviceMesh:
    """The mesh of ``layout`` whose worker ``i`` is global rank ``workers[i]``.

    Collective over the default process group: every rank calls it, parameter
    servers too (they are in no group of it). Raises ValueError when the layout does
    not hold exactly ``len(workers)`` workers."""
    if layout.world != len(workers):
        raise ValueError(
            f"the parallelism layout needs {layout.world} workers, the run has {len(workers)}"
        )
    ranks = torch.tensor(list(workers), dtype=torch.int64).reshape(layout.shape)
    return DeviceMesh(device_type, ranks, mesh_dim_names=layout.names)


def data_parallel_place(layout: MeshLayout, worker: int) -> tuple[int, int]:
    """(this worker's index among the data-parallel replicas, their number): the
    ranks of one replica — its tensor-parallel peers and pipeline stages — see the
    same batches."""
    c = layout.coords(worker)
    return c["dp_replicate"] * layout.dp_shard + c[
        "dp_shard"
    ], layout.dp_replicate * layout.dp_shard
