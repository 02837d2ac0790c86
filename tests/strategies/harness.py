"""Run a function on N real gloo ranks (spawned processes) and collect its results.

``run_ranks(fn, world_size, strategy="bmuf", params={...}, args=(...))`` starts
``world_size`` processes with the environment torchrun would give them plus the
``DMLCTL_STRATEGY*`` variables, so ``dmlctl.init()`` inside ``fn`` joins a real gloo
process group with that strategy. ``fn(ctx, *args)`` must be a module-level function
(it is pickled); its return value (picklable) comes back per rank, in rank order.
A rank that raises makes ``run_ranks`` raise with that rank's traceback.

``roles=["worker", "worker", "server"]`` gives the ranks roles the way the plan does
(``DMLCTL_LOCAL_ROLES``, by local rank; every rank is on one "host" here). A
parameter-server rank never runs ``fn``: ``dmlctl.init()`` serves and ends it with
``SystemExit(0)``, and its result is None.
"""

from __future__ import annotations

import io
import json
import os
import socket
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int,
    world_size: int,
    port: int,
    strategy: str,
    params: Mapping[str, Any],
    fn: Callable[..., Any],
    args: Sequence[Any],
    results: Any,
    roles: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "DMLCTL_STRATEGY": strategy,
            "DMLCTL_STRATEGY_PARAMS": json.dumps(dict(params)),
            "OMP_NUM_THREADS": "1",
        }
    )
    os.environ.pop("DMLCTL_RANK_DIR", None)
    if roles:
        os.environ["DMLCTL_LOCAL_ROLES"] = ",".join(roles)
    os.environ.update(env or {})
    import torch

    torch.set_num_threads(1)
    import dmlctl

    try:
        ctx = dmlctl.init()
        value = fn(ctx, *args)
        # Bytes, not tensors: a tensor sent through the queue is a shared-memory handle
        # that dies with this process, which may exit before the parent reads it.
        buf = io.BytesIO()
        torch.save(value, buf)
        results.put((rank, True, buf.getvalue()))
        ctx.close()
    except SystemExit as exc:  # a parameter server's normal end
        if exc.code not in (0, None):
            results.put((rank, False, traceback.format_exc()))
            return
        buf = io.BytesIO()
        torch.save(None, buf)
        results.put((rank, True, buf.getvalue()))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *,
    strategy: str = "ssgd",
    params: Mapping[str, Any] | None = None,
    args: Sequence[Any] = (),
    timeout: float = 120.0,
    roles: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """``fn(ctx, *args)`` on every rank; the results in rank order. A run whose rank 0
    could not listen on the port picked for it (another process took it between the
    pick and the bind: the harness's race, before ``fn`` ran) is started again on a
    new port, at most twice."""
    for attempt in range(3):
        try:
            return _run_once(fn, world_size, strategy, params, args, timeout, roles, env)
        except AssertionError as exc:
            if "EADDRINUSE" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _run_once(
    fn: Callable[..., Any],
    world_size: int,
    strategy: str,
    params: Mapping[str, Any] | None,
    args: Sequence[Any],
    timeout: float,
    roles: Sequence[str],
    env: Mapping[str, str] | None,
) -> list[Any]:
    """One attempt of :func:`run_ranks`."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                r,
                world_size,
                port,
                strategy,
                params or {},
                fn,
                tuple(args),
                results,
                tuple(roles),
                dict(env or {}),
            ),
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            rank, ok, value = results.get(timeout=timeout)
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            got[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return [got[r] for r in range(world_size)]
