"""Prints every variable named in NAMES (comma-separated) with its value and length,
and each of its arguments with its length, as a careless script would; then waits
LINGER seconds (0 unless set)."""

import os
import sys
import time

for name in os.environ["NAMES"].split(","):
    value = os.environ[name]
    print(f"{name}={value} ({len(value)} characters)", flush=True)
for i, arg in enumerate(sys.argv[1:]):
    print(f"arg {i} ({len(arg)} characters): {arg}", flush=True)
time.sleep(float(os.environ.get("LINGER", "0")))
