"""What a rank sees of its world, written to OUT/world-<RANK>-<RESTART>.json: its
environment (as the script and as /proc see it), its command line, whether torch was
imported before the script ran, and the thread count torch takes after the script set
OMP_NUM_THREADS=2 before importing it. With --fail-first the first attempt fails."""

import glob
import json
import os
import sys
import time

PREIMPORTED = "torch" in sys.modules
os.environ["OMP_NUM_THREADS"] = "2"  # before torch is imported, as a script may do

import torch  # noqa: E402


def proc_environ() -> dict[str, str]:
    with open("/proc/self/environ", "rb") as f:
        pairs = [p.split(b"=", 1) for p in f.read().split(b"\0") if b"=" in p]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def main() -> None:
    out, fail_first = sys.argv[1], "--fail-first" in sys.argv
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = [a.decode() for a in f.read().split(b"\0") if a]
    seen = {
        "env": {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
        "proc_env": sorted(proc_environ()),
        "cmdline": cmdline,
        "argv": sys.argv,
        "preimported": PREIMPORTED,
        "threads": torch.get_num_threads(),
    }
    path = os.path.join(out, f"world-{os.environ['RANK']}-{restart}.json")
    with open(path, "w") as f:
        json.dump(seen, f)
    if fail_first and restart == "0":
        # every rank writes its world first: the first to fail has the others stopped
        world, deadline = int(os.environ["WORLD_SIZE"]), time.monotonic() + 60
        while len(glob.glob(os.path.join(out, "world-*-0.json"))) < world:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        raise SystemExit("the first attempt fails on purpose")


if __name__ == "__main__":
    main()
