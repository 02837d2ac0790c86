"""Workload of ``dmlctl bench logs``; a plain script (it never imports dmlctl).

``--mode flood`` prints ``--lines`` numbered lines to stdout as fast as it can, after
recording when it began (``start <epoch seconds>`` in ``--out``/rank-<R>.json).

``--mode loop`` is a training loop's shape: ``--lines`` iterations, each doing
``--work-iters`` iterations of arithmetic (the same work in every run) and then
printing one line, to stdout or, with ``--sink devnull``, to /dev/null; it records the
loop's wall time.
"""

import argparse
import json
import os
import sys
import time


def work(iterations: int) -> float:
    x = 0.0
    for i in range(iterations):
        x += i * 0.5
    return x


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("flood", "loop"), required=True)
    p.add_argument("--lines", type=int, required=True)
    p.add_argument("--work-iters", type=int, default=10_000)
    p.add_argument("--sink", choices=("stdout", "devnull"), default="stdout")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    result: dict[str, float] = {"start": time.time()}
    if args.mode == "flood":
        for i in range(args.lines):
            print(f"rank {rank} line {i} of the flood, some more text as a log line has")
    else:
        sink = open(os.devnull, "w") if args.sink == "devnull" else sys.stdout  # noqa: SIM115
        start = time.perf_counter()
        for i in range(args.lines):
            work(args.work_iters)
            print(f"step {i} loss {1.0 / (i + 1):.6f} rank {rank}", file=sink)
        result["loop_s"] = time.perf_counter() - start
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
