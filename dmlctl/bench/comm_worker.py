"""Collective micro-benchmark, one process per rank (an nccl-tests ``*_perf`` for torch).

Run it with torchrun or as a dmlctl job (``dmlctl bench comm`` does the latter)::

    python -m torch.distributed.run --standalone --nproc-per-node 2 comm_worker.py \\
        --ops allreduce,allgather,broadcast --min-bytes 1K --max-bytes 16M --factor 4

For each op and each size of the sweep every rank runs ``--warmup`` untimed calls,
meets the others at a barrier, then times ``--iters`` calls with
``time.perf_counter`` (each call's work object is waited on; on CUDA the device is
synchronised before the clock stops). The reported time is the slowest rank's
average per call (an ``all_reduce(MAX)``), so one slow rank cannot hide.

Rank 0 emits one record per (op, size) with values ``op, bytes, count, dtype,
time_us, algbw_gbps, busbw_gbps`` (see :mod:`dmlctl.bench.report` for the
definitions): through :func:`dmlctl.protocol.rank_event_writer` when
``DMLCTL_RANK_DIR`` is set, else as one JSON line on stdout.

The backend is ``nccl`` when CUDA is available, else ``gloo``. A process group
that already exists (e.g. created by the dmlctl runtime) is reused, not destroyed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from dmlctl.bench.report import OPS, bus_factor, parse_ops, parse_size, size_sweep
from dmlctl.errors import UsageError
from dmlctl.protocol import ENV_RANK_DIR, rank_event_writer

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int32": torch.int32,
}

Op = Callable[[], Any]


def _arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The worker's command line (sizes accept units: ``1K``, ``16M``)."""
    p = argparse.ArgumentParser(description="Time torch.distributed collectives.")
    p.add_argument("--ops", type=_arg(parse_ops), default=OPS)
    p.add_argument("--min-bytes", type=_arg(parse_size), default=1024)
    p.add_argument("--max-bytes", type=_arg(parse_size), default=16 << 20)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    try:
        args.sizes = size_sweep(args.min_bytes, args.max_bytes, args.factor)
    except UsageError as exc:
        p.error(str(exc))
    return args


def _make_op(op: str, nbytes: int, dtype: torch.dtype, device: torch.device) -> tuple[Op, int, int]:
    """A zero-argument call issuing one ``op`` asynchronously, its count and its size column.

    Buffers are zeros so repeated sums never overflow into inf/nan.
    """
    n = dist.get_world_size()
    elt = torch.empty((), dtype=dtype).element_size()
    if op == "allgather":
        count = max(1, nbytes // (elt * n))
        send = torch.zeros(count, dtype=dtype, device=device)
        recv = torch.empty(count * n, dtype=dtype, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return (lambda: gather(recv, send, async_op=True)), count, count * n * elt
    count = max(1, nbytes // elt)
    buf = torch.zeros(count, dtype=dtype, device=device)
    if op == "allreduce":
        return (lambda: dist.all_reduce(buf, async_op=True)), count, count * elt
    if op == "broadcast":
        return (lambda: dist.broadcast(buf, src=0, async_op=True)), count, count * elt
    raise ValueError(f"unknown op {op!r}")


def _run(call: Op, times: int, device: torch.device) -> None:
    for _ in range(times):
        call().wait()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    op: str, nbytes: int, *, iters: int, warmup: int, dtype: torch.dtype, device: torch.device
) -> dict[str, Any]:
    """Time ``op`` at ``nbytes`` on every rank; return the record values (same on all ranks)."""
    call, count, size = _make_op(op, nbytes, dtype, device)
    _run(call, warmup, device)
    dist.barrier()
    start = time.perf_counter()
    _run(call, iters, device)
    local = (time.perf_counter() - start) / iters
    slowest = torch.tensor([local], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    seconds = float(slowest.item())
    algbw = size / seconds / 1e9 if seconds > 0 else 0.0
    return {
        "op": op,
        "bytes": size,
        "count": count,
        "dtype": str(dtype).removeprefix("torch."),
        "time_us": seconds * 1e6,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * bus_factor(op, dist.get_world_size()),
    }


def _emitter(rank: int) -> Callable[[int, dict[str, Any]], None]:
    rank_dir = os.environ.get(ENV_RANK_DIR)
    if rank_dir:
        writer = rank_event_writer(rank_dir, rank)
        return writer.metric
    return lambda step, values: print(json.dumps({"step": step, "values": values}), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep; returns the process exit code (0)."""
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group("nccl" if cuda else "gloo")
    try:
        rank = dist.get_rank()
        emit = _emitter(rank) if rank == 0 else None
        step = 0
        for op in args.ops:
            for nbytes in args.sizes:
                values = measure(
                    op,
                    nbytes,
                    iters=args.iters,
                    warmup=args.warmup,
                    dtype=DTYPES[args.dtype],
                    device=device,
                )
                if emit is not None:
                    emit(step, values)
                step += 1
    finally:
        if owns_group:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    main()
