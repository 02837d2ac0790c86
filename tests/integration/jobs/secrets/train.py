"""Prints every variable named in NAMES (comma-separated) with its value and length,
as a careless script would."""

import os

for name in os.environ["NAMES"].split(","):
    value = os.environ[name]
    print(f"{name}={value} ({len(value)} characters)", flush=True)
