"""Prints LINES numbered lines as fast as it can, on stdout and stderr."""

import os
import sys

rank = int(os.environ["RANK"])
lines = int(sys.argv[1])
for i in range(lines):
    stream = sys.stderr if i % 10 == 0 else sys.stdout
    stream.write(f"r{rank} line {i}\n")
