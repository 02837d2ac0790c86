"""Prints LINES numbered lines to stdout as fast as it can (one write each)."""

import os
import sys

rank = int(os.environ["RANK"])
lines = int(sys.argv[1])
for i in range(lines):
    print(f"r{rank} line {i}")
