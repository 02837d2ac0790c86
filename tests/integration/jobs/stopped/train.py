"""On the first attempt rank 1 stops itself (SIGSTOP) after a few steps: a hang."""

import os
import signal
import time

import dmlctl

ctx = dmlctl.init()
attempt = int(os.environ.get("DMLCTL_ATTEMPT", "1"))
for step in range(1, 40):
    ctx.log(step=step, loss=1.0 / step)
    if attempt == 1 and ctx.rank == 1 and step == 5:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(0.05)
print(f"rank {ctx.rank} finished on attempt {attempt}", flush=True)
