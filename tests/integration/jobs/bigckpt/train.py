"""Trains 20 steps of one WIDTH x WIDTH linear layer (SGD with momentum, so a
checkpoint holds weights and momentum: 8 * WIDTH**2 bytes per rank), checkpoints as
the job's ``checkpoint:`` block says and resumes from the newest one. Every rank
prints where it starts and, at the end, ``done at step 20``."""

import os

import torch

import dmlctl

torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)
width = int(os.environ.get("WIDTH", "400"))
net = torch.nn.Linear(width, width)
model, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
step = ctx.resume(model, opt)
print(f"rank {ctx.rank} starts at step {step}", flush=True)
x = torch.randn(8, width)
while step < 20:
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    ctx.log(step=step, loss=loss)
    ctx.checkpoint(step, model, opt)
print(f"rank {ctx.rank} done at step {step}", flush=True)
