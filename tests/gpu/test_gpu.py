"""Every strategy on a GPU: the device paths of each (two workers sharing ``cuda:0``
over gloo), parameter servers fed by a GPU worker over ``cpu:gloo,cuda:nccl``, the
examples with one worker, the refusal of two NCCL workers on one GPU, and a checkpoint
resumed on the GPU. Real launches (``python -m dmlctl launch``); skipped where CUDA is
absent. Run them with ``make test-gpu``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dmlctl.strategies import registry
from tests.conftest import REPO, Cli

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available here"),
]

EXAMPLES = REPO / "examples"
TRAIN = EXAMPLES / "parameter-server" / "train.py"
#: Prints each worker's device and backend, then runs the example's script unchanged.
WRAPPER = """\
import runpy, sys
import torch.distributed as dist
import dmlctl
ctx = dmlctl.init(seed=0)  # a server serves here and never returns
backend = dist.get_backend() if dist.is_initialized() else "none"
print(f"DEVICE rank={ctx.global_rank} device={ctx.device} backend={backend}", flush=True)
sys.argv[0] = "train.py"
runpy.run_path("train.py", run_name="__main__")
"""
#: Strategy params that a 2-worker, 1-epoch run of the example takes besides the
#: defaults (none: every strategy runs on its defaults).
CASES = {
    **{name: {} for name in registry.names()},
    "ssgd-fp16": {"compression": "fp16"},
    "ssgd-powersgd": {"compression": "powersgd"},
    "ssgd-topk": {"compression": "topk"},
    "ssgd-int8": {"compression": "int8"},
    "ssgd-sign": {"compression": "sign"},
    "asgd-overlap": {"overlap": True, "push_compression": "threshold"},
    "asgd-int8": {"push_compression": "int8"},  # error feedback kept on the CPU
}
#: The final accuracy line of the examples' scripts.
ACCURACY = re.compile(r"final (?:test loss \S+ )?accuracy:? ([0-9.]+)")


def accuracy(out: str) -> float:
    found = ACCURACY.findall(out)
    return float(found[-1]) if found else 0.0


def strategy_of(case: str) -> str:
    return case if case in registry.names() else case.split("-")[0]


def write_job(directory: Path, case: str, backend: str, workers: int) -> Path:
    """A job running the wrapped example with strategy ``case`` on its defaults (the
    parameter-server example's script; hogwild's and cyclades' their own)."""
    name = strategy_of(case)
    own = EXAMPLES / name / "train.py"
    shutil.copy(own if own.is_file() else TRAIN, directory / "train.py")
    (directory / "gpu_train.py").write_text(WRAPPER)
    servers = 1 if "server" in registry.capabilities(name).roles else 0
    params = CASES[case]
    lines = [
        f"name: gpu-{case}",
        "script: gpu_train.py",
        'args: ["--epochs", "2"]',
        f"workers: {workers}",
        f"backend: {backend}",
        f"parameter_servers: {servers}" if servers else "",
        "strategy:",
        f"  name: {name}",
        f"  params: {params!r}".replace("True", "true") if params else "",
    ]
    job = directory / "job.yaml"
    job.write_text("\n".join(line for line in lines if line) + "\n")
    return job


def launched(cli: Cli, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    proc = cli.run("launch", *args, "--ui", "plain", timeout=timeout)
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


def devices(out: str) -> dict[int, tuple[str, str]]:
    """Each worker's (device, backend) from the wrapper's lines."""
    found = re.findall(r"DEVICE rank=(\d+) device=(\S+) backend=(\S+)", out)
    return {int(rank): (device, backend) for rank, device, backend in found}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_strategy_on_two_workers_sharing_one_gpu_over_gloo(
    cli: Cli, tmp_path: Path, case: str
) -> None:
    proc = launched(cli, str(write_job(tmp_path, case, "gloo", 2)))
    seen = devices(proc.stdout)
    on_cpu = not registry.uses_gpus(strategy_of(case))
    expected = "cpu" if on_cpu else "cuda:0"
    assert len(seen) == 2 and {d for d, _ in seen.values()} == {expected}, proc.stdout[-3000:]
    assert {b for _, b in seen.values()} == {"gloo"}
    assert accuracy(proc.stdout) > 0.5, proc.stdout[-3000:]


@pytest.mark.parametrize(
    "example", sorted(p.name for p in (EXAMPLES / "parameter-server").glob("*.yaml"))
)
def test_each_parameter_server_example_with_one_gpu_worker_on_nccl(
    cli: Cli, tmp_path: Path, example: str
) -> None:
    job = tmp_path / example
    text = (EXAMPLES / "parameter-server" / example).read_text()
    job.write_text(text.replace("backup_workers: 1", "backup_workers: 0"))
    shutil.copy(TRAIN, tmp_path / "train.py")
    proc = launched(cli, str(job), "--workers", "1")
    assert accuracy(proc.stdout) > 0.5, proc.stdout[-3000:]


@pytest.mark.parametrize(
    "example", sorted(p.name for p in (EXAMPLES / "strategies").glob("*.yaml"))
)
def test_each_strategy_example_with_one_gpu_worker(cli: Cli, example: str) -> None:
    launched(cli, str(EXAMPLES / "strategies" / example), "--workers", "1")


@pytest.mark.parametrize("example", ["tensor", "fsdp", "distbelief"])
def test_each_parallel_example_on_workers_sharing_one_gpu_over_gloo(
    cli: Cli, tmp_path: Path, example: str
) -> None:
    """Tensor parallelism, FSDP2 and DistBelief (DTensor parameters on CUDA: torch's
    foreach kernels must not see them mixed with plain ones; validation batches moved
    to the device by ``ctx.eval_step``)."""
    job = tmp_path / f"{example}.yaml"
    text = (EXAMPLES / "parallel" / f"{example}.yaml").read_text()
    job.write_text(f"{text.rstrip()}\nbackend: gloo\nworkdir: {EXAMPLES / 'parallel'}\n")
    proc = launched(cli, str(job))
    assert "validation loss" in proc.stdout, proc.stdout[-3000:]


def test_a_gpu_worker_feeds_a_cpu_parameter_server_over_cpu_gloo_cuda_nccl(
    cli: Cli, tmp_path: Path
) -> None:
    proc = launched(cli, str(write_job(tmp_path, "asgd", "auto", 1)))
    assert set(devices(proc.stdout).values()) == {("cuda:0", "cpu:gloo,cuda:nccl")}
    (run,) = cli.runs()
    status = json.loads(cli.run("status", run.name, "--json").stdout)
    worker = next(r for r in status["ranks"] if r["role"] == "worker")
    server = next(r for r in status["ranks"] if r["role"] == "server")
    assert worker["metrics"]["gpu_reserved_bytes"] > 0  # the dashboard's GPU mem column
    assert "gpu_mem_bytes" not in server["metrics"]


def test_two_nccl_workers_on_one_gpu_are_refused_before_anything_starts(cli: Cli) -> None:
    if torch.cuda.device_count() != 1:
        pytest.skip("needs exactly one visible GPU")
    quickstart = EXAMPLES / "quickstart" / "job.yaml"
    proc = cli.run("launch", str(quickstart), "--workers", "2", "--ui", "plain")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "2 workers on 1 GPU: NCCL cannot put two ranks on one GPU" in proc.stderr
    assert cli.runs() == []


RESUMED = """\
import os
import torch
import dmlctl

ctx = dmlctl.init(seed=0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
model, opt = ctx.prepare(model, opt)
step = ctx.resume(model, opt)
while step < 40:
    x = torch.randn(32, 16, device=ctx.device)  # the CUDA generator: restored on resume
    loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    ctx.checkpoint(step, model, opt)
    if step == 25 and os.environ.get("CRASH") and os.environ["DMLCTL_ATTEMPT"] == "1":
        raise SystemExit(3)
weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
print(f"WEIGHTS {weights.sum().item():.6f} on {weights.device}", flush=True)
"""


def test_a_checkpoint_saved_on_the_gpu_resumes_there_to_the_same_model(
    cli: Cli, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(RESUMED)
    sums = []
    for crash in ("", "1"):
        job = tmp_path / "job.yaml"
        job.write_text(
            "script: train.py\nworkers: 1\n"
            f"env: {{CRASH: '{crash}'}}\n"
            "checkpoint: {every_steps: 10}\n"
            "restart: {max_user_restarts: 1, backoff_initial: 0.1}\n"
        )
        proc = launched(cli, str(job))
        (weights,) = re.findall(r"WEIGHTS (\S+) on cuda:0", proc.stdout)
        sums.append(float(weights))
    assert sums[0] == pytest.approx(sums[1], rel=1e-5, abs=1e-5)
