"""Rank 1 is SIGKILLed on the first attempt (as an out-of-memory killer or an admin
would), after a few steps; the next attempt finishes. Each rank says which Slurm node
it ran on."""

import os
import signal

import dmlctl

ctx = dmlctl.init()
ctx.barrier()  # both ranks connected: gloo's init lets one finish before the other has
attempt = int(os.environ.get("DMLCTL_ATTEMPT", "1"))
for step in range(1, 4):
    ctx.log(step=step, loss=1.0 / step)
if attempt == 1 and ctx.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
node = os.environ.get("SLURMD_NODENAME", "?")
print(f"rank {ctx.rank} finished on attempt {attempt} on {node}", flush=True)
