"""Rank 1 raises after two all-reduces; the others then wait in a collective that
would hang for gloo's 30-minute default timeout if nobody stopped them."""

import torch
import torch.distributed as dist

import dmlctl

ctx = dmlctl.init()
t = torch.ones(1)
for step in range(1, 4):
    if step == 3 and ctx.rank == 1:
        raise RuntimeError("loss is NaN at step 3")
    dist.all_reduce(t)
    ctx.log(step=step, loss=1.0 / step)
