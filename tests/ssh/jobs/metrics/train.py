"""Every rank logs a falling loss and prints where it runs."""

import socket
import time

import dmlctl

ctx = dmlctl.init()
print(f"rank {ctx.rank} of {ctx.world_size} on {socket.gethostname()}", flush=True)
for step in range(1, 4):
    ctx.log(step=step, loss=1.0 / step)
    time.sleep(0.05)
ctx.barrier()
