"""Raises at step 3 on rank 1; rank 0 keeps going until it is stopped."""

import time

import dmlctl

ctx = dmlctl.init()
for step in range(1, 50):
    ctx.log(step=step, loss=1.0 / step)
    print(f"step {step}", flush=True)
    if step == 3 and ctx.rank == 1:
        raise ValueError("bad batch at step 3")
    time.sleep(0.1)
