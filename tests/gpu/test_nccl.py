"""What runs on NCCL on a GPU: ``ssgd``'s filter hooks (int8, topk, sign) encode,
exchange and decode on the GPU, and the hang detector's reading of the flight recorder
sees NCCL's collectives (NCCL keeps a recorder of its own). Each check runs in a fresh
interpreter (the recorder's size is read once per process). Skipped where CUDA is
absent; ``make test-gpu`` runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, Cli
from tests.gpu.test_gpu import accuracy, launched, write_job

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available here"),
]

#: One DDP step of a two-layer model on ``cuda:0`` with a filter hook, in a world of one
#: whose group is NCCL alone (a CPU tensor there has no backend): prints the devices the
#: hook encoded on and the gradients it left.
FILTER_STEP = """\
import json, sys
import torch, torch.distributed as dist
from dmlctl.runtime import filters
from dmlctl.strategies.ssgd.compression import MeteredDDP, install

kind, backend, store = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
seen = []
encode = filters.encode
def recording(state, x, sizes, reference=None):
    seen.append(str(x.device))
    return encode(state, x, sizes, reference)
filters.encode = recording
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
model = MeteredDDP(model.cuda(), device_ids=[0])
install(model, kind, density=0.05)
model(torch.randn(32, 64, device="cuda")).square().mean().backward()
torch.cuda.synchronize()
grads = [p.grad.detach().cpu().reshape(-1).tolist() for p in model.parameters()]
print(json.dumps({"devices": sorted(set(seen)), "grads": grads}))
dist.destroy_process_group()
"""

#: Five NCCL all-reduces and two gloo ones, then one NCCL all-reduce queued behind a
#: GPU sleep; prints the recorder's rows after the five and while the sixth waits.
RECORDER = """\
import json, sys, time
import torch, torch.distributed as dist
from dmlctl.runtime import collectives

dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"file://{sys.argv[1]}", rank=0,
                        world_size=1)
gpu, cpu = torch.ones(1024, device="cuda"), torch.ones(8)
for _ in range(5):
    dist.all_reduce(gpu)
for _ in range(2):
    dist.all_reduce(cpu)
torch.cuda.synchronize()
deadline = time.monotonic() + 10
while time.monotonic() < deadline:  # NCCL's watchdog retires entries on its own thread
    done = collectives.snapshot() or {}
    if done.get("0/nccl", [0, 0])[1] == 5:
        break
    time.sleep(0.1)
torch.cuda._sleep(3_000_000_000)  # seconds of GPU time ahead of the next collective
dist.all_reduce(gpu)
time.sleep(0.5)
pending = collectives.snapshot()
torch.cuda.synchronize()
c = torch._C._distributed_c10d
dump = getattr(c, "_dump_nccl_trace_json", None)
raw = json.loads(dump(True, False)) if dump is not None else {}
seen = {"symbols": [n for n in dir(c) if "dump" in n], "keys": sorted(raw),
        "last": (raw.get("entries") or [None])[-1], "pg_status": raw.get("pg_status")}
print(json.dumps({"done": done, "pending": pending, "seen": seen}, default=str))
dist.destroy_process_group()
"""


def run_python(code: str, *args: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter with the flight recorder on (the size the
    plan sets: ``TORCH_FR_BUFFER_SIZE`` alone) and return the JSON it printed last."""
    env = {k: v for k, v in os.environ.items() if "TRACE_BUFFER" not in k}
    env.update(
        TORCH_FR_BUFFER_SIZE="200", PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("kind", ["int8", "topk", "sign"])
@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_filter_hooks_encode_on_the_gpu_where_nccl_carries_the_bytes(
    tmp_path: Path, kind: str, backend: str
) -> None:
    got = run_python(FILTER_STEP, kind, backend, str(tmp_path / "store"))
    assert got["devices"] == ["cuda:0"]
    grads = [torch.tensor(g) for g in got["grads"]]  # type: ignore[attr-defined]
    flat = torch.cat(grads)
    if kind == "topk":  # 5 % of the bucket's elements survive, the rest are zeros
        assert int(flat.count_nonzero()) == pytest.approx(0.05 * flat.numel(), abs=2)
    elif kind == "sign":  # one magnitude per tensor: its mean |gradient|
        assert all(len(set(g.abs().tolist())) == 1 for g in grads)
    else:  # multiples of one scale: max |g| / 127
        scale = flat.abs().max() / 127
        assert torch.allclose(flat / scale, (flat / scale).round(), atol=1e-3)


def test_the_flight_recorder_reading_sees_nccl_collectives_and_the_one_pending(
    tmp_path: Path,
) -> None:
    got = run_python(RECORDER, str(tmp_path / "store"))
    done, pending = got["done"], got["pending"]
    assert isinstance(done, dict) and isinstance(pending, dict), got
    assert done["0"][:2] == [2, 2], got  # gloo's own numbering
    assert done["0/nccl"][:2] == [5, 5], got
    entered, completed, op, age, size = pending["0/nccl"]
    assert (entered, completed, size) == (6, 5, 1), got
    assert "all_reduce" in op or "allreduce" in op, got
    assert age >= 0.3, got


@pytest.mark.parametrize("kind", ["int8", "topk", "sign"])
def test_ssgd_with_each_filter_trains_one_gpu_worker_over_nccl(
    cli: Cli, tmp_path: Path, kind: str
) -> None:
    proc = launched(cli, str(write_job(tmp_path, f"ssgd-{kind}", "auto", 1)))
    assert accuracy(proc.stdout) > 0.5, proc.stdout[-3000:]
