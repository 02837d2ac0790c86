"""Parameter-server transport benchmark, one process per rank (``dmlctl bench ps`` runs it).

Layout: of the ``W + S`` ranks, ``0 … W-1`` are workers and ``W … W+S-1`` servers
(``--servers S``). For each size ``B`` of the sweep (``--min-bytes`` … ``--max-bytes``,
times ``--factor``) the ``B/4`` float32 elements are cut into ``S`` near-equal
chunks, placed with :func:`dmlctl.ps.shards.plan_shards` (one shard per server).
Then, ``--warmup`` untimed and ``--iters`` timed times, every rank does:

1. **a barrier, then one PS round.** Each worker times
   :meth:`WorkerChannel.push` of ``B`` bytes of gradient (every shard) and then
   :meth:`WorkerChannel.pull` of every shard, and sends DONE; all workers start
   together, as in a synchronous training step. Each server answers one session
   through :class:`ServerChannel` — PUSH adds the payload into its shard, PULL
   replies with the shard and its version — and returns once every worker sent
   DONE. Gradients are ones and shards start at zero, so a pulled shard must
   equal its version; the worker checks that after its clock stopped.
2. **a barrier, then one timed** ``all_reduce`` of ``B`` bytes of float32 zeros on
   all ``W + S`` ranks (the same processes).

PS and all-reduce samples alternate so that load from outside (a shared machine)
hits both sides alike. Each rank takes the median of its samples
(``statistics.median_low``: a measured value, the lower middle one for an even
count), and an ``all_reduce(MAX)`` gives the slowest worker's round and the slowest
rank's all-reduce. The definitions of throughput and ratio are in
:mod:`dmlctl.bench.ps_report`.

Every rank logs one record per size through ``ctx.log`` (so its heartbeat shows
progress): its own medians (``bench: "ps-rank"``); rank 0's record is the result
(``bench: "ps"``, :func:`~dmlctl.bench.ps_report.record_values`) plus its own medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

import dmlctl
from dmlctl.bench.ps_report import ps_result, record_values
from dmlctl.bench.report import parse_size, size_sweep
from dmlctl.errors import UsageError
from dmlctl.ps.channel import Op, ServerChannel, WorkerChannel
from dmlctl.ps.shards import plan_shards, shard_loads

Timing = tuple[float, float]
"""(push, pull) seconds of one round."""


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The rank's command line (sizes accept units: ``64K``, ``16M``)."""
    p = argparse.ArgumentParser(description="Time PS push+pull against all_reduce.")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--min-bytes", type=_size, default=64 << 10)
    p.add_argument("--max-bytes", type=_size, default=16 << 20)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.servers < 1:
        p.error("--iters and --servers must be >= 1 and --warmup >= 0")
    if args.min_bytes < 4 * args.servers:
        p.error(f"--min-bytes must be at least 4 bytes per server ({4 * args.servers})")
    try:
        args.sizes = size_sweep(args.min_bytes, args.max_bytes, args.factor)
    except UsageError as exc:
        p.error(str(exc))
    return args


def layout(count: int, workers: int, servers: int) -> tuple[list[int], list[int]]:
    """``(shard_servers, shard_numel)`` for ``count`` elements on ranks ``workers …``:
    ``S`` near-equal chunks, placed by :func:`plan_shards`; shard ``k`` is what server
    ``workers + k`` holds."""
    chunks = [count // servers + (k < count % servers) for k in range(servers)]
    loads = shard_loads(chunks, plan_shards(chunks, servers))
    return [workers + k for k in range(servers)], loads


class Shards:
    """A server's shards for one size: flat parameters (zeros at first) and versions
    (pushes applied so far), kept across the rounds of that size."""

    def __init__(self, shard_numel: dict[int, int]) -> None:
        self.numel = shard_numel
        self.flat = {s: torch.zeros(n) for s, n in shard_numel.items()}
        self.version = dict.fromkeys(shard_numel, 0)


def serve(rank: int, shards: Shards, workers: int) -> None:
    """Answer PUSH / PULL until all ``workers`` sent DONE (one session)."""
    channel = ServerChannel(rank, shards.numel)
    finished = 0
    while finished < workers:
        msg = channel.receive()
        assert msg is not None  # no timeout: it blocks until a message comes
        if msg.op is Op.PUSH and msg.payload is not None:
            shards.flat[msg.shard_id].add_(msg.payload)
            shards.version[msg.shard_id] += 1
        elif msg.op is Op.PULL:
            sid = msg.shard_id
            channel.reply(msg.worker, sid, shards.version[sid], shards.flat[sid])
        elif msg.op is Op.DONE:
            finished += 1
        elif msg.op is not Op.HELLO:  # a worker's first message in the run
            raise RuntimeError(f"unexpected {msg.op.name} from rank {msg.worker}")


def push_pull(channel: WorkerChannel, grads: dict[int, torch.Tensor], clock: int) -> Timing:
    """One round, then DONE: (push, pull) seconds. Checks every pulled shard after the
    clock stopped: all ones were pushed into zeros, so it must equal its version."""
    start = time.perf_counter()
    channel.push(grads, clock)
    pushed = time.perf_counter()
    pulled = channel.pull(list(grads), clock)
    timing = (pushed - start, time.perf_counter() - pushed)
    channel.done(clock)
    for shard_id, got in pulled.items():
        ends = got.flat[[0, -1]].tolist()
        if ends != [float(got.version)] * 2:
            raise RuntimeError(f"shard {shard_id}: pulled {ends} at version {got.version}")
    return timing


def measure(
    rank: int, nbytes: int, workers: int, servers: int, iters: int, warmup: int
) -> dict[str, Any]:
    """One size on every rank: this rank's record values (rank 0's carry the result).

    ``warmup + iters`` times: a barrier, one PS round (servers serve one session),
    a barrier, one ``all_reduce``; the last ``iters`` of each are timed.
    """
    count = nbytes // 4
    shard_servers, shard_numel = layout(count, workers, servers)
    worker = rank < workers
    channel = WorkerChannel(rank, shard_servers, shard_numel)
    grads = {s: torch.ones(n) for s, n in enumerate(shard_numel)} if worker else {}
    held = {s: n for s, n in enumerate(shard_numel) if shard_servers[s] == rank}
    shards = Shards(held)
    buf = torch.zeros(count)
    ps: list[Timing] = []
    allreduce: list[float] = []
    for i in range(warmup + iters):
        dist.barrier()
        if worker:
            ps.append(push_pull(channel, grads, i))
        elif held:
            serve(rank, shards, workers)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buf)
        allreduce.append(time.perf_counter() - start)
    push_s, pull_s = _median_split(ps[warmup:]) if worker else (0.0, 0.0)
    allreduce_s = statistics.median_low(allreduce[warmup:])
    slowest = torch.tensor([push_s + pull_s, allreduce_s], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    own = {
        "bench": "ps-rank",
        "bytes": count * 4,
        "role": "worker" if worker else "server",
        "local_push_us": push_s * 1e6,
        "local_pull_us": pull_s * 1e6,
        "local_allreduce_us": allreduce_s * 1e6,
    }
    if rank != 0:
        return own
    result = ps_result(
        count * 4,
        workers=workers,
        servers=servers,
        round_s=float(slowest[0]),
        allreduce_s=float(slowest[1]),
    )
    return {**own, **record_values(result)}


def _median_split(timings: list[Timing]) -> Timing:
    """The (push, pull) of the median round (``median_low`` of push + pull)."""
    totals = [push + pull for push, pull in timings]
    return timings[totals.index(statistics.median_low(totals))]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep; returns the process exit code (0)."""
    args = parse_args(argv)
    ctx = dmlctl.init()
    workers = ctx.world_size - args.servers
    if workers < 1:
        raise SystemExit(f"need a worker: {ctx.world_size} ranks, {args.servers} servers")
    for step, nbytes in enumerate(args.sizes):
        values = measure(ctx.rank, nbytes, workers, args.servers, args.iters, args.warmup)
        ctx.log(step=step, **values)
    ctx.close()
    return 0


if __name__ == "__main__":
    main()
