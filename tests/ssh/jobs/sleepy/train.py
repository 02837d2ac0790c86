"""Sleeps for argv[1] seconds, printing a heartbeat, then succeeds."""

import sys
import time

import dmlctl

ctx = dmlctl.init()
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    ctx.log(loss=1.0)
    time.sleep(0.2)
