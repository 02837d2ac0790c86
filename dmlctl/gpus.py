"""Which process-group backend a rank joins with and which GPU a worker takes (pure:
no torch). The planner uses it to refuse a job its hosts' GPUs cannot hold before
anything starts; every rank uses it to pick its device (:mod:`dmlctl.runtime.devices`).

* **Backend.** ``auto`` (the default) on a rank that can use CUDA is PyTorch's
  device-to-backend form ``cpu:gloo,cuda:nccl``: CUDA tensors go through NCCL, CPU
  tensors (dmlctl's own control traffic, parameter servers) through gloo. ``nccl``
  means the same (NCCL has no CPU form, and dmlctl's control traffic is on CPU);
  ``gloo`` carries both through gloo and lets workers share GPUs. Without CUDA every
  backend is ``gloo``, except that ``nccl`` and ``cpu:gloo,cuda:nccl`` are refused on
  a worker.
* **GPUs.** Workers take GPUs by their index among the host's workers (local rank
  order, servers skipped): worker ``i`` takes ``cuda:i`` of the GPUs the process sees
  (``CUDA_VISIBLE_DEVICES`` applies). Servers never take one. More workers than GPUs
  is refused under NCCL (it cannot put two ranks on one GPU); under ``gloo`` worker
  ``i`` takes ``cuda:(i mod GPUs)``.
"""

from __future__ import annotations

AUTO = "auto"
GLOO = "gloo"
NCCL = "nccl"
MIXED = "cpu:gloo,cuda:nccl"
#: What a job's ``backend:`` may say.
BACKENDS = (AUTO, NCCL, GLOO, MIXED)


class DeviceError(ValueError):
    """A rank cannot get the device or backend its job asks for (the message says why)."""


def shares_gpus(backend: str) -> bool:
    """Whether workers may share a GPU under ``backend`` (gloo only)."""
    return backend == GLOO


def group_backend(requested: str, *, cuda: bool, worker: bool = True) -> str:
    """The backend string for ``init_process_group`` on a rank that can (``cuda``) or
    cannot use CUDA, for the job's ``requested`` backend (module docstring). Raises
    :class:`DeviceError` for an NCCL backend on a worker without CUDA. ``requested`` is
    one of :data:`BACKENDS` (the job file and the rank's environment are checked)."""
    if requested == GLOO:
        return GLOO
    if cuda:
        return MIXED
    if requested != AUTO and worker:
        raise DeviceError(
            f"backend {requested!r} needs CUDA, and this worker has no GPU that PyTorch can "
            "use; set backend: auto (or gloo) to train on CPU"
        )
    return GLOO


def needs_a_gpu(workers: int, gpus: int, backend: str) -> str | None:
    """Why a host with ``gpus`` GPUs (0: none) cannot run ``workers`` workers under the
    job's ``backend``: an NCCL backend on a host without a GPU (see
    :func:`group_backend`), or None."""
    if workers <= 0 or gpus > 0 or backend in (AUTO, GLOO):
        return None
    return (
        f"backend {backend!r} needs CUDA, and this host has no GPU that PyTorch can use; "
        "set backend: auto (or gloo) to train on CPU"
    )


def too_few_gpus(workers: int, gpus: int, backend: str) -> str | None:
    """Why a host with ``gpus`` GPUs cannot run ``workers`` workers under the job's
    ``backend``, or None (a host without GPUs runs its workers on CPU)."""
    if gpus <= 0 or workers <= gpus or shares_gpus(backend):
        return None
    return (
        f"{workers} workers on {gpus} GPU{'s' if gpus != 1 else ''}: NCCL cannot put two "
        f"ranks on one GPU; lower workers to {gpus}, or set backend: gloo (the workers "
        "then share the GPUs, slower)"
    )


def worker_gpu(index: int, gpus: int, backend: str) -> int:
    """The GPU (an index among the visible ones) of the host's ``index``-th worker.
    Raises :class:`DeviceError` when NCCL would need a GPU twice."""
    if gpus <= 0:
        raise DeviceError("this host has no GPU")
    if index < gpus:
        return index
    if shares_gpus(backend):
        return index % gpus
    raise DeviceError(
        f"worker {index} of this host has no GPU of its own: "
        + str(too_few_gpus(index + 1, gpus, backend))
    )


def worker_index(roles: list[str], local_rank: int, worker_role: str) -> int:
    """Position of ``local_rank`` among the host's workers (``roles`` by local rank;
    empty: every local rank is a worker)."""
    if not roles:
        return local_rank
    return sum(1 for role in roles[:local_rank] if role == worker_role)
