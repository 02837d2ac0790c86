"""The example transformer (small) on a learnable token pattern, laid out by the job's
``parallelism:`` block: 12 steps, a checkpoint every 4 when the job has a
``checkpoint:`` block, and on the first attempt (``--fail-at N``) rank 1 raises after
step N — the restart resumes from the sharded checkpoint. Rank 0 prints the losses."""

import argparse
import os

import torch

import dmlctl
from dmlctl.bench.parallel_job.model import Config, loss_fn, transformer

parser = argparse.ArgumentParser()
parser.add_argument("--fail-at", type=int, default=0)
args = parser.parse_args()
torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)
model = transformer(Config(vocab=64, context=16, dim=32, heads=4, layers=4, hidden=64))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, opt = ctx.prepare(model, opt)
step = ctx.resume(model, opt)
print(f"rank {ctx.rank} starts at step {step}", flush=True)
attempt = int(os.environ.get("DMLCTL_ATTEMPT", "1"))
share = 8 // ctx.data_parallel_size
part = slice(ctx.data_parallel_rank * share, (ctx.data_parallel_rank + 1) * share)
losses = []
while step < 12:
    gen = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, 64, (8, 1), generator=gen)
    tokens = (start * 5 ** torch.arange(17) + 3 * torch.arange(17)) % 64
    x, y = tokens[:, :-1][part], tokens[:, 1:][part]
    loss = ctx.train_step(model, x, y, loss_fn)
    opt.step()
    opt.zero_grad()
    step += 1
    losses.append(ctx.all_reduce_mean(loss))
    ctx.log(step=step, loss=loss)
    ctx.checkpoint(step, model, opt)
    if attempt == 1 and step == args.fail_at and ctx.rank == 1:
        raise RuntimeError(f"failure after step {step} on the first attempt")
if ctx.is_main:
    print("losses " + " ".join(f"{v:.6f}" for v in losses), flush=True)
