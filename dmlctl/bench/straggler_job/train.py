# mypy: allow-untyped-calls
"""Training script of the straggler benchmark (``dmlctl bench straggler``).

An ordinary dmlctl loop — the same under ``ssgd``, ``asgd`` and ``ssp`` — on a tiny
linear model. Every step sleeps ``--step-sleep`` seconds (simulated compute); the
last worker sleeps ``--factor`` times as long, on every step or only on the steps
``START <= step < END`` of ``--burst START:END`` (steps count from 1).

Timing: each worker measures its own ``steps_per_s`` from the end of its first step
(whose one-time costs — ``ssgd``'s first all-reduce connects its group and builds the
buckets, most of a second on 2 cores — would hide a short run's pace) to the end of
its last ``opt.step()``, so the end-of-data synchronisation of the parameter-server
strategies is not counted either. One
record per worker at the end: ``bench="straggler"``, ``worker``, ``workers``,
``straggler`` (1 on the slowed worker) and ``steps_per_s``.
"""

import argparse
import time

import torch
import torch.nn.functional as F

import dmlctl

FEATURES, OUTPUTS = 16, 4


def parse_burst(text: str) -> tuple[int, int]:
    """``START:END`` (``1 <= START < END``) as a tuple."""
    start, sep, end = text.partition(":")
    if not sep or not start.isdigit() or not end.isdigit() or not 1 <= int(start) < int(end):
        raise argparse.ArgumentTypeError(f"expected START:END with 1 <= START < END, got {text!r}")
    return int(start), int(end)


parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--steps", type=int, default=60, help="Steps per worker.")
parser.add_argument("--step-sleep", type=float, default=0.03, help="Seconds slept per step.")
parser.add_argument("--factor", type=float, default=1.0, help="The last worker sleeps this × more.")
parser.add_argument("--burst", type=parse_burst, default=None, help="Slow only steps START..END-1.")
parser.add_argument("--batch-size", type=int, default=8, help="Per worker.")
args = parser.parse_args()

torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)
net = torch.nn.Linear(FEATURES, OUTPUTS)
model, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01))
n = args.steps * args.batch_size * ctx.world_size  # exactly --steps batches per worker
gen = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(
    torch.randn(n, FEATURES, generator=gen), torch.randn(n, OUTPUTS, generator=gen)
)
straggler = ctx.rank == ctx.world_size - 1


def pause(step: int) -> float:
    """Seconds of simulated compute at ``step`` on this worker."""
    slow = straggler and (args.burst is None or args.burst[0] <= step < args.burst[1])
    return float(args.step_sleep * (args.factor if slow else 1.0))


elapsed, start = 0.0, 0.0
ctx.barrier()
batches = ctx.shard(data, batch_size=args.batch_size, drop_last=True, seed=0)
for step, (x, y) in enumerate(batches, start=1):
    time.sleep(pause(step))
    loss = F.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step == 1:
        start = time.perf_counter()
    if step == args.steps:  # before the end of ctx.shard, which may synchronise
        elapsed = time.perf_counter() - start
ctx.log(
    step=args.steps,
    bench="straggler",
    worker=ctx.rank,
    workers=ctx.world_size,
    straggler=int(straggler),
    steps_per_s=(args.steps - 1) / elapsed,
)
