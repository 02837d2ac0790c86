"""Ends with work still in flight, as real scripts do: a non-daemon thread and a
ThreadPoolExecutor job still writing files, a file it never closes, and an atexit
handler. Prints what it was given (sys.argv, __file__, the attempt) and any warning
it sees."""

import atexit
import os
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

warnings.simplefilter("always")
rank = int(os.environ["RANK"])
out = os.path.join(os.environ["OUT_DIR"], f"rank-{rank}")
print(f"argv={sys.argv!r} file={__file__} main={__name__}", flush=True)
print(f"attempt={os.environ.get('DMLCTL_ATTEMPT')}", flush=True)


def slow_write(path: str) -> None:
    time.sleep(1.5)
    with open(path, "w") as f:
        f.write("done\n")


threading.Thread(target=slow_write, args=(out + ".thread",)).start()
ThreadPoolExecutor(max_workers=1).submit(slow_write, out + ".executor")
atexit.register(lambda: print("atexit ran", flush=True))
unclosed = open(out + ".unclosed", "w")  # noqa: SIM115 - never closed, on purpose
unclosed.write("kept\n")
print("script returns", flush=True)
