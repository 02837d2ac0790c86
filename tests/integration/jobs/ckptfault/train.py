"""Trains 20 steps with checkpoints every 5 (the job's ``checkpoint:`` block) and, on
the first attempt only, hurts its own checkpoints in the way ``FAULT`` names — from
this script alone, through the functions dmlctl's checkpoint code calls (``torch.save``,
``os.rename`` / ``os.replace``) or the committed files, never through a hook in dmlctl:

* ``none``      — no fault (the reference run);
* ``write``     — rank ``FAULT_RANK`` writes half of its step-10 file, then SIGKILL;
* ``precommit`` — rank ``FAULT_RANK`` (0: the committing rank) is SIGKILLed when it is
  about to rename the complete ``.tmp-step-10`` directory into place;
* ``prelatest`` — as ``precommit``, after that rename, before ``LATEST`` is replaced;
* ``truncate`` / ``bitflip`` — after step 10 is committed, rank ``FAULT_RANK`` cuts its
  own step-10 file in half / flips one byte of it, then is SIGKILLed at step 12;
* ``pickle``    — after step 10 is committed, rank ``FAULT_RANK`` replaces its own
  step-10 file with a pickle whose ``__reduce__`` would create ``MARKER``, makes the
  manifest's size + sha256 match it, then is SIGKILLed at step 12.

Every rank prints ``rank R attempt A starts at step S``; rank 0 prints the checkpoint
directory it was given and writes the final weights to ``OUT``. Each fault prints one
``ckptfault:`` line just before it strikes, so a test can tell it happened.
"""

import hashlib
import io
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import dmlctl

FAULT = os.environ.get("FAULT", "none")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_STEP, KILL_STEP = 10, 12
CORRUPTIONS = ("truncate", "bitflip", "pickle")
STEP_DIR = f"step-{FAULT_STEP:09d}"

torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)
attempt = int(os.environ.get("DMLCTL_ATTEMPT", "1"))
armed = FAULT != "none" and attempt == 1 and ctx.rank == FAULT_RANK
step = 0  # read by the wrappers below: the step being checkpointed


def die(what: str) -> None:
    print(f"ckptfault: rank {ctx.rank} {what}; SIGKILL", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


class Evil:
    """Unpickling it (with ``weights_only=False``) creates ``marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.marker),))


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".ckptfault")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def corrupt(directory: Path) -> None:
    """Hurt this rank's file of the just committed checkpoint ``directory``."""
    file = directory / f"rank-{ctx.rank}.pt"
    data = file.read_bytes()
    if FAULT == "truncate":
        data = data[: len(data) // 2]
    elif FAULT == "bitflip":
        middle = len(data) // 2
        data = data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]
    elif FAULT == "pickle":
        buf = io.BytesIO()
        real_save({"model": Evil(os.environ["MARKER"])}, buf)
        data = buf.getvalue()
        manifest_path = directory / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["files"][file.name] = {
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        }
        write_atomically(manifest_path, json.dumps(manifest, indent=1).encode())
    write_atomically(file, data)
    print(f"ckptfault: rank {ctx.rank} {FAULT} {directory.name}/{file.name}", flush=True)


real_save, real_rename, real_replace = torch.save, os.rename, os.replace


def save(obj: object, f: Any, *args: Any, **kwargs: Any) -> None:
    """``torch.save`` that, for the step-10 checkpoint, writes half and dies."""
    if FAULT == "write" and step == FAULT_STEP and hasattr(f, "write"):
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        die(f"wrote {len(data) // 2} of {len(data)} bytes of {Path(f.name).name} at step {step}")
    return real_save(obj, f, *args, **kwargs)


def guard(src: Any, dst: Any) -> None:
    src_p, dst_p = Path(os.fsdecode(src)), Path(os.fsdecode(dst))
    if FAULT == "precommit" and src_p.name == f".tmp-step-{FAULT_STEP}":
        held = sorted(p.name for p in src_p.iterdir() if p.name.endswith((".pt", ".json")))
        die(f"before committing {src_p.name} holding {held}")
    if FAULT == "prelatest" and dst_p.name == "LATEST" and step == FAULT_STEP:
        committed = (dst_p.parent / STEP_DIR).is_dir()
        die(f"before replacing LATEST (committed {STEP_DIR}: {committed})")


def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
    guard(src, dst)
    return real_rename(src, dst, *args, **kwargs)


def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
    guard(src, dst)
    return real_replace(src, dst, *args, **kwargs)


if armed:
    torch.save, os.rename, os.replace = save, rename, replace

gen = torch.Generator().manual_seed(7)
x, y = torch.randn(512, 8, generator=gen), torch.randint(0, 3, (512,), generator=gen)
data = torch.utils.data.TensorDataset(x, y)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
model, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
step = ctx.resume(model, opt)
print(f"rank {ctx.rank} attempt {attempt} starts at step {step}", flush=True)
if ctx.rank == 0:
    print(f"checkpoint dir: {os.environ.get('DMLCTL_CHECKPOINT_DIR')}", flush=True)
for xb, yb in ctx.shard(data, batch_size=16, epochs=2):
    if step == 20:
        break
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    ctx.log(step=step, loss=loss)
    saved = ctx.checkpoint(step, model, opt)
    if armed and saved and step == FAULT_STEP and FAULT in CORRUPTIONS:
        corrupt(Path(saved))
    if armed and step == KILL_STEP and FAULT in CORRUPTIONS:
        die(f"at step {step}")
    time.sleep(float(os.environ.get("STEP_SLEEP", "0")))
if ctx.rank == 0:
    torch.save({k: v.detach().clone() for k, v in net.state_dict().items()}, os.environ["OUT"])
