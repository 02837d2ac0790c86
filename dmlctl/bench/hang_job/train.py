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
* ``compile`` — the first training step computes for that long (a compiler's
  warm-up), inside the step loop;
* ``eval`` — a final evaluation after the last batch, half waiting, half computing,
  then the mean accuracy over all ranks (a collective);
* ``deadlock`` — at step ``--at`` the culprit blocks forever in ``wait_for_batch``
  (an event nobody sets) and never enters the step's collective;
* ``sigstop`` — at step ``--at`` the culprit stops itself with SIGSTOP.

The first three are healthy runs (exit 0); the last two hang. Before it hangs, the
culprit prints ``HANG <epoch seconds> <file>:<line>`` (where it will be stuck).
"""

import argparse
import inspect
import os
import signal
import threading
import time

import torch

import dmlctl


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--scenario",
        required=True,
        choices=("prep", "gil", "compile", "eval", "deadlock", "sigstop"),
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


def hold_the_lock(seconds: float) -> None:
    """Compute for about ``seconds`` in C without releasing the interpreter's lock."""
    start = time.perf_counter()
    sum(range(10**7))
    n = int(10**7 * seconds / max(time.perf_counter() - start, 1e-6))
    sum(range(n))  # one C call: no other thread of this process runs meanwhile


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
    ctx = dmlctl.init()
    extra = args.skew if ctx.rank == args.culprit else 0.0
    if args.scenario == "prep":
        stretch(args.seconds + extra)
    elif args.scenario == "gil":
        if ctx.rank == args.culprit:
            hold_the_lock(args.seconds + extra)
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
