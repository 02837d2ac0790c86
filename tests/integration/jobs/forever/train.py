"""Runs until stopped; spawns a child process that must die with it."""

import subprocess
import sys
import time

import dmlctl

ctx = dmlctl.init()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"rank {ctx.rank} child {child.pid}", flush=True)
for step in range(100000):
    ctx.log(step=step, loss=1.0)
    time.sleep(0.2)
