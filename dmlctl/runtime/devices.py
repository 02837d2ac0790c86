"""This rank's device and process-group backend (the rules: :mod:`dmlctl.gpus`).

A worker takes the GPU of its index among the host's workers; a server, a rank of a
strategy that shares parameters through host memory (hogwild, cyclades) and every
rank without CUDA compute on the CPU. The backend of a rank that can use CUDA is
``cpu:gloo,cuda:nccl`` unless the job says ``gloo``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from dmlctl import gpus
from dmlctl.protocol import ROLE_WORKER, local_roles
from dmlctl.runtime.env import RunEnv


@dataclass(frozen=True)
class Placement:
    """Where this rank computes and how it joins the process group."""

    device: torch.device
    backend: str


def place(
    env: RunEnv,
    environ: Mapping[str, str],
    *,
    on_gpu: bool = True,
    gpu_count: int | None = None,
) -> Placement:
    """This rank's :class:`Placement`. ``on_gpu`` False: the strategy trains on the
    CPU (host memory); ``gpu_count`` overrides what CUDA reports (tests). Raises
    :class:`~dmlctl.gpus.DeviceError` for an NCCL backend without a GPU, or when NCCL
    would need one GPU twice."""
    count = gpu_count if gpu_count is not None else _visible_gpus()
    worker = env.role == ROLE_WORKER
    backend = gpus.group_backend(env.backend, cuda=count > 0, worker=worker and on_gpu)
    if not (count > 0 and worker and on_gpu):
        return Placement(torch.device("cpu"), backend)
    if backend == gpus.GLOO and env.layout is not None and env.layout.pp > 1:
        raise gpus.DeviceError(
            "pipeline stages send activations point to point, which gloo cannot do for "
            "CUDA tensors: set backend: auto (NCCL) for a pipeline on GPUs"
        )
    index = gpus.worker_index(local_roles(environ), env.local_rank, ROLE_WORKER)
    return Placement(torch.device("cuda", gpus.worker_gpu(index, count, env.backend)), backend)


def _visible_gpus() -> int:
    """The GPUs PyTorch can use here (``CUDA_VISIBLE_DEVICES`` applied), 0 without CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
