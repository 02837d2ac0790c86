"""Training script of ``dmlctl bench parallel``: the example transformer
(:mod:`model`, 3.3M parameters) with AdamW on random byte windows, under whatever
layout the job's ``parallelism:`` block gives it (none: plain ssgd, DDP).

``--batch-size`` is the global batch: each of the ``ctx.data_parallel_size``
replicas takes its share, so every layout trains on the same samples per step.

After the first optimizer step each rank measures what it holds
(:func:`memory.held`) and the first worker also the whole model in one process
(:func:`memory.reference`). ``ctx.log`` runs twice, with those figures: after
``--warmup`` steps (it starts the timed window) and after the last step, whose
record carries ``samples_per_s`` over the timed steps (this rank's; the ranks of a
replica see the same batches).
"""

from __future__ import annotations

import argparse

import torch

import dmlctl
from dmlctl.bench.parallel_job.memory import held, reference, split_names
from dmlctl.bench.parallel_job.model import Config, loss_fn, transformer


def windows(n: int, cfg: Config) -> torch.utils.data.TensorDataset:
    """``n`` random (input, target) windows of ``cfg.context`` byte ids, fixed seed."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(cfg.vocab, (n, cfg.context), generator=gen)
    return torch.utils.data.TensorDataset(x, torch.roll(x, -1, dims=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="Steps, warm-up included.")
    parser.add_argument("--warmup", type=int, default=3, help="Untimed steps.")
    parser.add_argument("--batch-size", type=int, default=32, help="Global batch.")
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ctx = dmlctl.init(seed=0)
    cfg = Config()
    net = transformer(cfg)
    split = split_names(net)
    model, opt = ctx.prepare(net, torch.optim.AdamW(net.parameters(), lr=args.lr))
    figures = reference(cfg, split, args.lr) if ctx.is_main else {}
    per_replica = args.batch_size // ctx.data_parallel_size
    data = windows(args.steps * args.batch_size, cfg)
    ctx.total_steps = args.steps
    batches = ctx.shard(data, batch_size=per_replica, drop_last=True)
    for step, (x, y) in enumerate(batches, start=1):
        loss = ctx.train_step(model, x, y, loss_fn)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 1:
            figures.update(held(model, opt, split))
        if step in (args.warmup, args.steps):
            ctx.log(step=step, loss=loss, replicas=ctx.data_parallel_size, **figures)


if __name__ == "__main__":
    main()
