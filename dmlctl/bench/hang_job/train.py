# mypy: allow-untyped-calls
"""Workload of the hang detector's benchmark and tests (``dmlctl bench hangs``).

Two or more ranks train a small classifier with the job's strategy through the
dmlctl runtime (SGD with momentum), around one long stretch chosen by ``--scenario``.
Rank ``--culprit`` takes ``--skew`` seconds longer than the others in that stretch,
so they wait for it in a collective meanwhile:

* ``prep`` — data preparation after ``dmlctl.init()``: half waiting (as for a
  download), half computing, before the first batch;
* ``gil`` — the same, but the culprit computes in one long C call that never releases
  the interpreter's lock (as unpickling a big dataset does), so it cannot beat;
* ``starved`` — before ``dmlctl.init()`` the culprit holds the lock in one C call
  while 30 busy processes share its core, as each of 64 ranks importing torch on 2
  cores does: silent, runnable, under way with a few hundredths of a core;
* ``compile`` — the first training step computes for that long (a compiler's
  warm-up), inside the step loop;
* ``eval`` — a final evaluation after the last batch, half waiting, half computing,
  then the mean accuracy over all ranks (a collective);
* ``deadlock`` — at step ``--at`` the culprit blocks forever in ``wait_for_batch``
  (an event nobody sets) and never enters the step's collective;
* ``sigstop`` — at step ``--at`` the culprit stops itself with SIGSTOP.

The first four are healthy runs (exit 0); the last two hang. Before it hangs, the
culprit prints ``HANG <epoch seconds> <file>:<line>`` (where it will be stuck).
"""

import argparse
import inspect
import os
import signal
import subprocess
import sys
import threading
import time

import torch

import dmlctl


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--scenario",
        required=True,
        choices=("prep", "gil", "starved", "compile", "eval", "deadlock", "sigstop"),
    )
    p.add_argument("--seconds", type=float, default=35.0, help="Length of the long stretch.")
    p.add_argument("--skew", type=float, default=32.0, help="Extra seconds of the culprit.")
    p.add_argument("--culprit", type=int, default=1, help="The slow (or hanging) rank.")
    p.add_argument("--at", type=int, default=20, help="Step at which a hang starts.")
    p.add_argument("--steps", type=int, default=60, help="Training steps.")
    return p.parse_args()


def compute(seconds: float) -> None:
    """Keep one core busy for ``seconds``."""
    end = time.monotonic() + seconds
    x = torch.randn(128, 128)
    while time.monotonic() < end:
        x = torch.tanh(x @ x)


def lock_work(seconds: float) -> int:
    """How many integers :func:`hold_the_lock` sums in ``seconds`` at full speed."""
    start = time.perf_counter()
    sum(range(10**7))
    return int(10**7 * seconds / max(time.perf_counter() - start, 1e-6))


def hold_the_lock(n: int) -> None:
    """Compute in C without releasing the interpreter's lock (``lock_work`` sizes it)."""
    sum(range(n))  # one C call: no other thread of this process runs meanwhile


CROWD = 30
"""Busy processes :func:`starve` puts on the culprit's core: it gets a 31st of it."""


def starve(seconds: float) -> None:
    """Hold the interpreter's lock for about ``seconds`` while nearly starved of CPU,
    as a rank among many on a small machine is: :data:`CROWD` busy processes share
    this thread's one core meanwhile (each ends itself after ``seconds``), so the
    kernel keeps the thread runnable but gives it a few hundredths of a core. They
    are not this process's children (as other ranks are not): their CPU is not its."""
    cpus, core, n = os.sched_getaffinity(0), min(os.sched_getaffinity(0)), lock_work(1.0)
    end = time.monotonic() + seconds
    spawn = (
        f"import os, subprocess\nos.sched_setaffinity(0, {{{core}}})\n"
        f"for _ in range({CROWD}): subprocess.Popen("
        f"['timeout', '{seconds}', 'sh', '-c', 'while :; do :; done'])"
    )
    subprocess.run([sys.executable, "-c", spawn], check=True)  # it exits: they are orphans
    os.sched_setaffinity(0, {core})
    hold_the_lock(n)  # a second's work at a 31st of a core: until the crowd is gone
    os.sched_setaffinity(0, cpus)
    time.sleep(max(0.0, end - time.monotonic() + 0.5))


def stretch(seconds: float) -> None:
    """Half waiting, half computing."""
    time.sleep(seconds / 2)
    compute(seconds / 2)


def wait_for_batch() -> None:
    print(f"HANG {time.time():.3f} {here()}", flush=True)
    threading.Event().wait()  # nobody ever sets it


def here() -> str:
    frame = inspect.currentframe()
    caller = frame.f_back if frame is not None else None
    line = caller.f_lineno + 1 if caller is not None else 0
    return f"{os.path.basename(__file__)}:{line}"


def main() -> None:
    args = parse_args()
    if args.scenario == "starved" and int(os.environ["RANK"]) == args.culprit:
        starve(args.seconds + args.skew)
    ctx = dmlctl.init()
    extra = args.skew if ctx.rank == args.culprit else 0.0
    if args.scenario == "prep":
        stretch(args.seconds + extra)
    elif args.scenario == "gil":
        if ctx.rank == args.culprit:
            hold_the_lock(lock_work(args.seconds + extra))
        else:
            stretch(args.seconds)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.steps * 32 * ctx.world_size, 16, generator=g)
    y = (x.sum(1) > 0).long()
    model: torch.nn.Module = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
    )
    opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = ctx.prepare(model, opt)
    data = torch.utils.data.TensorDataset(x, y)
    for step, (xb, yb) in enumerate(ctx.shard(data, batch_size=32, epochs=1)):
        if args.scenario == "compile" and step == 0:
            compute(args.seconds + extra)
        if step == args.at and ctx.rank == args.culprit:
            if args.scenario == "deadlock":
                wait_for_batch()
            elif args.scenario == "sigstop":
                print(f"HANG {time.time():.3f} {here()}", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(loss=loss)
    if args.scenario == "eval":
        stretch(args.seconds + extra)
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean()
    print(f"rank {ctx.rank} done, accuracy {ctx.all_reduce_mean(accuracy):.3f}", flush=True)


if __name__ == "__main__":
    main()
