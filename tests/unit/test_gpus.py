"""Which backend a rank joins with and which device it computes on (:mod:`dmlctl.gpus`,
:mod:`dmlctl.runtime.devices`), with a fake GPU count: CI has no GPU."""

from __future__ import annotations

import typing

import pytest

from dmlctl import gpus, mesh
from dmlctl.protocol import ENV_BACKEND, ENV_LOCAL_ROLES
from dmlctl.runtime.devices import place
from dmlctl.runtime.env import read_env
from dmlctl.spec.models import JobSpec
from dmlctl.strategies import registry

MIXED = "cpu:gloo,cuda:nccl"


def test_the_job_file_accepts_exactly_the_backends_the_ranks_know() -> None:
    assert typing.get_args(JobSpec.model_fields["backend"].annotation) == gpus.BACKENDS


@pytest.mark.parametrize(
    ("requested", "cuda", "worker", "chosen"),
    [
        ("auto", True, True, MIXED),
        ("nccl", True, True, MIXED),  # dmlctl's own CPU traffic still needs gloo
        (MIXED, True, False, MIXED),
        ("gloo", True, True, "gloo"),
        ("auto", False, True, "gloo"),
        ("nccl", False, False, "gloo"),  # a server on a host without CUDA
    ],
)
def test_the_process_group_backend(requested: str, cuda: bool, worker: bool, chosen: str) -> None:
    assert gpus.group_backend(requested, cuda=cuda, worker=worker) == chosen


def test_an_nccl_backend_on_a_worker_without_cuda_says_how_to_train_on_cpu() -> None:
    with pytest.raises(gpus.DeviceError, match=r"needs CUDA.*set backend: auto"):
        gpus.group_backend("nccl", cuda=False)


@pytest.mark.parametrize(
    ("workers", "n_gpus", "backend", "refused"),
    [(2, 1, "auto", True), (2, 1, "nccl", True), (2, 1, "gloo", False), (2, 2, "auto", False),
     (8, 0, "auto", False)],
)  # fmt: skip
def test_more_workers_than_gpus_is_refused_under_nccl_only(
    workers: int, n_gpus: int, backend: str, refused: bool
) -> None:
    assert (gpus.too_few_gpus(workers, n_gpus, backend) is not None) is refused


def env(local_rank: int, roles: str = "", backend: str = "auto", **extra: str) -> dict[str, str]:
    out = {"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": "4"}
    if roles:
        out[ENV_LOCAL_ROLES] = roles
        out["DMLCTL_STRATEGY"] = "asgd"
    if backend != "auto":
        out[ENV_BACKEND] = backend
    return {**out, **extra}


def placed(environ: dict[str, str], n_gpus: int, on_gpu: bool = True) -> tuple[str, str]:
    where = place(read_env(environ, registry.load), environ, on_gpu=on_gpu, gpu_count=n_gpus)
    return str(where.device), where.backend


def test_workers_take_gpus_by_their_index_among_the_hosts_workers_and_servers_none() -> None:
    roles = "worker,server,worker"
    assert placed(env(0, roles), 2) == ("cuda:0", MIXED)
    assert placed(env(1, roles), 2) == ("cpu", MIXED)  # the server: CPU, CUDA traffic possible
    assert placed(env(2, roles), 2) == ("cuda:1", MIXED)
    assert placed(env(1), 0) == ("cpu", "gloo")


def test_under_gloo_workers_share_gpus_round_robin_and_under_nccl_a_second_one_is_refused() -> None:
    assert placed(env(3, backend="gloo"), 2) == ("cuda:1", "gloo")
    assert placed(env(2, backend="gloo"), 2) == ("cuda:0", "gloo")
    with pytest.raises(gpus.DeviceError, match="worker 2 of this host has no GPU of its own"):
        placed(env(2), 2)


def test_a_strategy_that_shares_host_memory_trains_on_the_cpu_of_a_gpu_host() -> None:
    assert not registry.uses_gpus("hogwild") and not registry.uses_gpus("cyclades")
    assert registry.uses_gpus("ssgd") and registry.uses_gpus("asgd")
    assert placed(env(3), 1, on_gpu=False) == ("cpu", MIXED)


def test_a_pipeline_over_gloo_on_gpus_is_refused_with_the_backend_to_use() -> None:
    layout = mesh.dumps(mesh.MeshLayout(pp=2, dp_replicate=2))
    environ = env(0, backend="gloo", DMLCTL_PARALLELISM=layout)
    with pytest.raises(gpus.DeviceError, match="set backend: auto"):
        placed(environ, 1)
    assert placed(environ, 0) == ("cpu", "gloo")


def test_a_bad_backend_in_the_rank_environment_names_the_variable() -> None:
    with pytest.raises(ValueError, match="DMLCTL_BACKEND='mpi' is not one of"):
        read_env(env(0, backend="mpi"), registry.load)


def test_a_cpu_workers_staging_hands_its_tensors_through_unchanged() -> None:
    import torch

    from dmlctl.ps.staging import Staging

    staging = Staging(torch.device("cpu"))
    flat = torch.arange(4.0)
    staged, ready = staging.to_host({3: flat})
    ready()
    assert staged[3] is flat  # no copy on a CPU worker
    (back,) = staging.to_device([flat])
    assert back is flat
