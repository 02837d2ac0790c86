"""Rank 1 dies from a signal (no Python exception) after saying why on stderr."""

import os
import signal
import sys
import time

rank = int(os.environ["RANK"])
if rank == 1:
    print("native code is about to crash", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)
time.sleep(30)
