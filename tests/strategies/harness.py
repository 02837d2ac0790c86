"""Run a function on N real gloo ranks and collect its results.

``run_ranks(fn, world_size, strategy="bmuf", params={...}, args=(...))`` runs ``fn`` on
``world_size`` ranks of the session's warm pool (:mod:`tests.strategies.pool`), with
the environment torchrun would give them plus the ``DMLCTL_STRATEGY*`` variables, so
``dmlctl.init()`` inside ``fn`` joins a real gloo process group with that strategy.
``fn(ctx, *args)`` must be a module-level function (it is pickled); its return value
(picklable) comes back per rank, in rank order. A rank that raises makes ``run_ranks``
raise with that rank's traceback.

``roles=["worker", "worker", "server"]`` gives the ranks roles the way the plan does
(``DMLCTL_LOCAL_ROLES``, by local rank; every rank is on one "host" here). A
parameter-server rank never runs ``fn``: ``dmlctl.init()`` serves and ends it with
``SystemExit(0)``, and its result is None.

``fresh=True`` runs the ranks in processes of their own instead of the pool, for a test
about what a new process has (its imports, its exit).
"""

from __future__ import annotations

import importlib.util
import io
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import torch

from dmlctl.bench import accuracy
from tests.strategies.pool import Task, free_port, pool, run_in_fresh_processes

HANG_S = 240.0
"""The longest a pooled task may take: under pytest's timeout (300 s), so that a hang
fails with every rank's stacks (:meth:`~tests.strategies.pool.RankPool.run`)."""


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
    fresh: bool = False,
) -> list[Any]:
    """``fn(ctx, *args)`` on every rank; the results in rank order. A run whose rank 0
    could not listen on the port picked for it (another process took it between the
    pick and the bind: the harness's race, before ``fn`` ran) is started again on a
    new port, at most twice."""
    for attempt in range(3):
        task = Task(
            fn=fn,
            args=tuple(args),
            port=free_port(),
            strategy=strategy,
            params=dict(params or {}),
            roles=tuple(roles),
            env=dict(env or {}),
        )
        try:
            if fresh:
                raw = run_in_fresh_processes(world_size, task, timeout)
            else:
                # below pytest's own timeout, so that a hang's rank stacks are shown
                raw = pool(world_size).run(task, min(timeout, HANG_S))
        except AssertionError as exc:
            if "EADDRINUSE" not in str(exc) or attempt == 2:
                raise
            continue
        return [torch.load(io.BytesIO(value), weights_only=False) for value in raw]
    raise AssertionError("unreachable")


JOBS = accuracy.JOB_DIR  # the accuracy bench's job scripts


def bench_job(name: str) -> ModuleType:
    """The bench's job script ``dmlctl/bench/accuracy_job/<name>.py`` as a module (it is
    a script, not a package module), loaded afresh: ``digits`` or ``lm``."""
    spec = importlib.util.spec_from_file_location(f"dmlctl_bench_{name}", JOBS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
