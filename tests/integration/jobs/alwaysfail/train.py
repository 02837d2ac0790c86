"""Fails on every attempt (an exception on rank 1)."""

import os

import dmlctl

ctx = dmlctl.init()
attempt = int(os.environ.get("DMLCTL_ATTEMPT", "1"))
for step in range(1, 4):
    ctx.log(step=step, loss=1.0 / step)
if ctx.rank == 1:
    raise RuntimeError("transient failure on the first attempt")
print(f"rank {ctx.rank} finished on attempt {attempt}", flush=True)
