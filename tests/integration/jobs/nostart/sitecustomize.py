"""Rank 1 of this job never gets past its interpreter's start (a hang before any of
dmlctl's code runs in it); every other process starts as usual."""

import os
import time

if os.environ.get("RANK") == "1" and os.environ.get("DMLCTL_RANK_DIR"):
    while True:
        time.sleep(1)
