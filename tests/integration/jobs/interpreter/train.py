"""Prints, as one JSON line, what a new interpreter would give a rank: path, argv,
signal handlers, stdio, threads, exit handlers, open descriptors, random state.

As every training script does when it makes its optimizer, it imports torch._dynamo
first (a forked rank has it already: sympy's filter for its own deprecation warnings
comes with it)."""

import atexit
import json
import logging
import os
import signal
import sys
import warnings

preloaded = "torch" in sys.modules and "torch._dynamo" in sys.modules
import numpy  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402


def _fds() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the directory listing itself
        if int(fd) > 2 and target != os.devnull:
            out.append(os.path.basename(target) if target.startswith("/") else target)
    return sorted(out)


print(
    json.dumps(
        {
            "preloaded": preloaded,
            "argv": sys.argv,
            "file": __file__,
            "name": __name__,
            "path": sys.path,
            "cwd": os.getcwd(),
            "flags": list(sys.flags),
            "threads": torch.get_num_threads(),
            "signals": {
                s.name: str(signal.getsignal(s))
                for s in signal.valid_signals()
                if isinstance(s, signal.Signals) and s not in (signal.SIGKILL, signal.SIGSTOP)
            },
            "session": os.getsid(0) == os.getpid(),
            "stdout": [sys.stdout.write_through, sys.stdout.line_buffering, sys.stdout.encoding],
            "stderr": [sys.stderr.write_through, sys.stderr.errors],
            "logging": len(logging.root.handlers),
            "warnings": len(warnings.filters),
            "inductor cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
            "fds": _fds(),
            "numpy": float(numpy.random.rand()),
            "rank": int(os.environ["RANK"]),
            "exit handlers": atexit._ncallbacks() >= 4,
        },
        sort_keys=True,
    ),
    flush=True,
)
