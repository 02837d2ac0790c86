# mypy: allow-untyped-calls
"""Training script of the recovery benchmark (``dmlctl bench recovery``).

A plain torchrun script: it never imports dmlctl and runs unchanged under bare
``torchrun --max-restarts 1`` and under ``dmlctl launch``. Two or more ranks train a
tiny linear model with DDP over gloo; each step sleeps ``--sleep`` seconds so that
steps take a measurable time.

Its own checkpoint logic: rank 0 saves ``{"step", "model", "optim"}`` with
``torch.save`` to ``<ckpt-dir>/ckpt.pt`` every ``--every`` steps (written to a
temporary file, then ``os.replace``); on start every rank loads that file if it
exists (``weights_only=True``) and resumes after its step.

The fault: on the first attempt only (``DMLCTL_ATTEMPT`` under dmlctl, else
``TORCHELASTIC_RESTART_COUNT`` under torchrun; absent = 0), rank ``--kill-rank``
records the wall-clock time and then SIGKILLs itself right after completing step
``--kill-at``.

Timing: every rank appends lines ``KIND STEP TIME ATTEMPT`` (``TIME`` from
``time.time()``, ``STEP`` -1 where there is none) to ``<timing-dir>/rank-<R>.timing``:

* ``start`` — the script started (before importing torch);
* ``imported`` — torch imported;
* ``joined`` — the process group is initialised;
* ``built`` — model and optimizer built (the first optimizer imports torch._dynamo);
* ``resumed_from`` — the step the checkpoint held (0 without one), once loaded;
* ``step`` — a training step completed;
* ``kill`` — the rank is about to SIGKILL itself after this step.
"""

import time

START = time.time()  # before torch: the import is part of what a restart costs

import argparse  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

IMPORTED = time.time()
FEATURES = 16


def arguments(doc: str, *, checkpoints: bool = True) -> argparse.ArgumentParser:
    """The command line of this script (of ``train_ps.py`` without ``checkpoints``);
    the defaults are the benchmark's settings."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--timing-dir", required=True, help="Where rank-<R>.timing files go.")
    if checkpoints:
        p.add_argument("--ckpt-dir", required=True, help="Where ckpt.pt is saved and loaded.")
        p.add_argument("--every", type=int, default=5, help="Checkpoint every this many steps.")
    p.add_argument("--steps", type=int, default=25, help="Steps of the whole training.")
    p.add_argument("--kill-at", type=int, default=12, help="Step after which the kill comes.")
    p.add_argument("--kill-rank", type=int, default=1, help="Rank that kills itself.")
    p.add_argument("--sleep", type=float, default=0.05, help="Seconds of 'compute' per step.")
    return p


def attempt() -> int:
    """0 on the first attempt, n on the n-th restart, under either launcher."""
    value = os.environ.get("DMLCTL_ATTEMPT")  # 1 on the first attempt
    if value:
        return int(value) - 1
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


class Timing:
    """Appends ``KIND STEP TIME ATTEMPT`` lines; each line is one write() call, so it
    is in the file before a SIGKILL that follows it."""

    def __init__(self, directory: str, rank: int, attempt: int) -> None:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"rank-{rank}.timing")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._attempt = attempt

    def record(self, kind: str, step: int = -1, when: float | None = None) -> None:
        t = time.time() if when is None else when
        os.write(self._fd, f"{kind} {step} {t:.6f} {self._attempt}\n".encode("ascii"))


def save(path: str, step: int, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
    """Write the checkpoint of ``step`` to ``path`` atomically (tmp file + rename)."""
    tmp = f"{path}.tmp"
    torch.save({"step": step, "model": model.state_dict(), "optim": optim.state_dict()}, tmp)
    os.replace(tmp, path)


def load(path: str, model: torch.nn.Module, optim: torch.optim.Optimizer) -> int:
    """Load ``path`` into ``model`` and ``optim`` if it exists; the step it holds (or 0)."""
    if not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    return int(state["step"])


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same data for a given (step, rank) on every attempt."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(32, FEATURES, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def main() -> None:
    """Train, checkpoint, record timings; kill ``--kill-rank`` on the first attempt."""
    args = arguments(__doc__ or "").parse_args()
    this_attempt = attempt()
    rank = int(os.environ["RANK"])
    timing = Timing(args.timing_dir, rank, this_attempt)
    timing.record("start", when=START)
    timing.record("imported", when=IMPORTED)
    dist.init_process_group("gloo")
    timing.record("joined")

    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    timing.record("built")
    ckpt = os.path.join(args.ckpt_dir, "ckpt.pt")
    done = load(ckpt, model, optim)
    timing.record("resumed_from", done)
    ddp = DistributedDataParallel(model)
    if rank == 0:
        os.makedirs(args.ckpt_dir, exist_ok=True)

    loss: torch.Tensor | None = None
    for step in range(done + 1, args.steps + 1):
        x, y = batch(step, rank)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optim.zero_grad()
        time.sleep(args.sleep)
        loss.backward()
        optim.step()
        if rank == 0 and step % args.every == 0:
            save(ckpt, step, model, optim)
        timing.record("step", step)
        if this_attempt == 0 and rank == args.kill_rank and step == args.kill_at:
            timing.record("kill", step)
            os.kill(os.getpid(), signal.SIGKILL)

    dist.barrier()
    # DDP (its reducer, and the last loss's graph that holds its hooks) goes while the
    # group still exists: freed after destroy_process_group, on main()'s return, one
    # restarted rank sat in that teardown with the interpreter's lock held (idle, no
    # heartbeat, its stack at main()'s call) until the hang detector stopped it.
    del ddp
    loss = None  # drops the last graph, which holds DDP's hooks
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
