"""Handles SIGTERM the usual preemption way: saves (slowly), then exits 0."""

import os
import signal
import sys
import time

import dmlctl

ctx = dmlctl.init()
out = os.path.join(os.environ["OUT_DIR"], f"rank-{ctx.rank}.saved")


def save_and_exit(signum: int, _frame: object) -> None:
    print(f"rank {ctx.rank} got signal {signum}, saving", flush=True)
    time.sleep(float(os.environ.get("SAVE_S", "2")))  # a checkpoint that takes a while
    with open(out, "w") as f:
        f.write("saved\n")
    sys.exit(0)


signal.signal(signal.SIGTERM, save_and_exit)
for step in range(100000):
    ctx.log(step=step, loss=1.0)
    time.sleep(0.1)
