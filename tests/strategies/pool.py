"""A pool of warm gloo ranks: one set of processes per world size, kept for the whole
test session, each test's function sent to them.

The anchor is PyTorch's own ``MultiProcContinuousTest``
(``torch.testing._internal.common_distributed``): the processes have torch (and
dmlctl) imported before they start — they are forked from a server process that
imported them once per test process (multiprocessing's ``forkserver``, so a new or
restarted pool costs a fork, not an import of torch); every task then joins a fresh
process group on a fresh port through ``dmlctl.init()``, runs the function, closes the
context (which destroys the group) and waits for the next task. Promises:

* a task sees what a fresh process would: the parent's environment as it was when the
  task was made plus the task's variables (the pool's own is restored afterwards),
  torch's default seed, and
  dmlctl's per-process state (the context, the step guards, the progress tracker)
  reset;
* a rank that raises, or a task that runs past its timeout, kills the whole pool (its
  other ranks may be stuck in a collective with the dead one): the error raised in the
  parent carries that rank's traceback, and the next task starts a new pool;
* a parameter-server rank's ``SystemExit(0)`` ends the task, not the process.

Tests that need a process of their own (exit codes, signals, ``atexit``, what a fresh
interpreter has imported) ask :func:`tests.strategies.harness.run_ranks` for
``fresh=True``.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import io
import json
import os
import queue
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.multiprocessing as mp

#: Seconds a pool process is given to finish its current task when the pool shuts down.
_JOIN_S = 5.0
#: Tasks a pool runs before it is started afresh (each leaves a few idle gloo threads).
_TASKS_PER_POOL = 40
#: How often the parent, waiting for answers, checks that every rank process lives.
_POLL_S = 0.5
STACKS_SIGNAL = signal.SIGUSR1
"""Makes a rank process print its threads' stacks (dmlctl's ranks take SIGUSR2)."""
STACKS_WAIT_S = 2.0
#: How often a pool process checks that the test process that made it is alive.
_PARENT_POLL_S = 1.0
#: What the fork server imports once, before it forks any pool process.
_PRELOAD = [
    *("torch", "torch.distributed", "torch._dynamo"),  # dynamo: every optimizer imports it
    *("dmlctl", "dmlctl.runtime", "tests.strategies.pool"),
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Task:
    """One function to run on every rank, with what the ranks' environment needs."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    port: int
    strategy: str
    params: dict[str, Any]
    roles: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    #: The parent's environment when the task was made (a spawned process inherits it):
    #: what a test set with ``monkeypatch.setenv`` reaches the ranks.
    base_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


def task_env(rank: int, world_size: int, task: Task) -> dict[str, str]:
    """The variables torchrun (and the plan) would give rank ``rank`` for ``task``."""
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(task.port),
        "DMLCTL_STRATEGY": task.strategy,
        "DMLCTL_STRATEGY_PARAMS": json.dumps(task.params),
        "OMP_NUM_THREADS": "1",
    }
    if task.roles:
        env["DMLCTL_LOCAL_ROLES"] = ",".join(task.roles)
    env.update(task.env)
    return env


def run_task(rank: int, world_size: int, task: Task) -> tuple[bool, Any]:
    """Run ``task`` on this rank: ``(True, bytes of torch.save(result))`` or
    ``(False, traceback text)``. The caller restores the environment."""
    import torch

    import dmlctl

    os.environ.clear()
    os.environ.update(task.base_env)
    os.environ.pop("DMLCTL_RANK_DIR", None)
    os.environ.pop("DMLCTL_LOCAL_ROLES", None)
    os.environ.update(task_env(rank, world_size, task))
    torch.set_num_threads(1)
    try:
        ctx = dmlctl.init()
        value = task.fn(ctx, *task.args)
        # Bytes, not tensors: a tensor sent through the queue is a shared-memory handle
        # that dies with this process, which may exit before the parent reads it.
        buf = io.BytesIO()
        torch.save(value, buf)
        ctx.close()
        return True, buf.getvalue()
    except SystemExit as exc:  # a parameter server's normal end
        if exc.code not in (0, None):
            return False, traceback.format_exc()
        buf = io.BytesIO()
        torch.save(None, buf)
        return True, buf.getvalue()
    except BaseException:
        return False, traceback.format_exc()


def _reset_process_state(default_seed: int) -> None:
    """What a fresh rank process starts with: no context, no guard armed, a new
    progress tracker, torch's default seed."""
    import torch

    from dmlctl.runtime import guards, progress, session

    session._current = None
    guards._state.update(prepared=False, joining=False)
    progress.TRACKER.__init__()  # type: ignore[misc]
    torch.manual_seed(default_seed)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (a pid taken by someone else's process
    counts as gone)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _end_with_parent(parent: int) -> None:
    """End this process once ``parent`` (the test process, not the fork server) is
    gone (a pytest-xdist worker leaves without running ``atexit``): a pool never
    outlives the test session that made it."""

    def watch() -> None:
        while _alive(parent):
            time.sleep(_PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="rank-pool-parent-watch", daemon=True).start()


def _serve_tasks(rank: int, world_size: int, inbox: Any, results: Any, parent: int) -> None:
    """A pool process: run tasks from ``inbox`` until it sends None."""
    _end_with_parent(parent)
    faulthandler.register(STACKS_SIGNAL, all_threads=True)  # a hang's stacks, on stderr
    import torch

    import dmlctl  # noqa: F401  (imported once, here)

    default_seed = torch.initial_seed()
    pristine = dict(os.environ)
    while True:
        item = inbox.get()
        if item is None:
            return
        task_id, task = item
        _reset_process_state(default_seed)
        try:
            ok, value = run_task(rank, world_size, task)
        finally:
            os.environ.clear()
            os.environ.update(pristine)
        results.put((task_id, rank, ok, value))


class RankPool:
    """``world_size`` warm rank processes (see the module docstring)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._mp = mp.get_context("forkserver")
        self._mp.set_forkserver_preload(_PRELOAD)  # read when the server starts
        self._procs: list[Any] = []
        self._inboxes: list[Any] = []
        self._results: Any = None
        self._next_id = 0
        self._tasks = 0

    def _start(self) -> None:
        self._results = self._mp.Queue()
        self._inboxes = [self._mp.Queue() for _ in range(self.world_size)]
        self._procs = [
            self._mp.Process(
                target=_serve_tasks,
                args=(r, self.world_size, self._inboxes[r], self._results, os.getpid()),
                daemon=True,
                name=f"rank-pool-{self.world_size}-{r}",
            )
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()

    def run(self, task: Task, timeout: float) -> list[bytes]:
        """Every rank's ``torch.save`` bytes of ``task``'s result, in rank order.
        ``AssertionError`` with the rank's traceback when one fails, or when the task
        is not done within ``timeout`` seconds (the pool is then restarted)."""
        if self._tasks >= _TASKS_PER_POOL:
            self.close()
        if not self._procs or not all(p.is_alive() for p in self._procs):
            self.kill()
            self._start()
            self._tasks = 0
        self._tasks += 1
        self._next_id += 1
        task_id = self._next_id
        for inbox in self._inboxes:
            inbox.put((task_id, task))
        got: dict[int, bytes] = {}
        try:
            while len(got) < self.world_size:
                got_id, rank, ok, value = self._get(timeout)
                if got_id != task_id:
                    continue  # a late answer to an earlier task
                if not ok:
                    raise AssertionError(f"rank {rank} failed:\n{value}")
                got[rank] = value
        except BaseException:
            self.kill()
            raise
        return [got[r] for r in range(self.world_size)]

    def _get(self, timeout: float) -> tuple[int, int, bool, Any]:
        """The next answer, or ``AssertionError`` at once when a rank process died,
        or after ``timeout`` seconds without one (a hang)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                item: tuple[int, int, bool, Any] = self._results.get(timeout=_POLL_S)
                return item
            except queue.Empty:
                pass
            dead = {r: p.exitcode for r, p in enumerate(self._procs) if not p.is_alive()}
            if dead:
                raise AssertionError(f"rank processes died (rank: exit code): {dead}")
            if time.monotonic() > deadline:
                self._dump_stacks()
                raise AssertionError(
                    f"task not done within {timeout:g} s: a hang (every rank's stacks are "
                    "in the captured stderr)"
                )

    def _dump_stacks(self) -> None:
        """Have every rank process print its threads' stacks to stderr (captured with
        the test), and give them a moment to."""
        for p in self._procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, STACKS_SIGNAL)
        time.sleep(STACKS_WAIT_S)

    def kill(self) -> None:
        """End every process of the pool at once (a task may be stuck in it)."""
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(_JOIN_S)
        self._procs = []

    def close(self) -> None:
        """Ask every process to end after its task; kill the ones that do not."""
        for inbox in self._inboxes:
            inbox.put(None)
        for p in self._procs:
            p.join(_JOIN_S)
        self.kill()


_pools: dict[int, RankPool] = {}


def pool(world_size: int) -> RankPool:
    """The session's pool of ``world_size`` ranks (started on its first task)."""
    if world_size not in _pools:
        _pools[world_size] = RankPool(world_size)
    return _pools[world_size]


@atexit.register
def close_pools() -> None:
    """End every pool of this process (at the end of the test session)."""
    while _pools:
        _pools.popitem()[1].close()


def _fresh_rank(rank: int, world_size: int, task: Task, results: Any) -> None:
    ok, value = run_task(rank, world_size, task)
    results.put((0, rank, ok, value))


def run_in_fresh_processes(world_size: int, task: Task, timeout: float) -> list[bytes]:
    """Like :meth:`RankPool.run`, in ``world_size`` new processes that end with it."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_fresh_rank, args=(r, world_size, task, results))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    got: dict[int, bytes] = {}
    try:
        for _ in range(world_size):
            _, rank, ok, value = results.get(timeout=timeout)
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(_JOIN_S)
            if p.is_alive():
                p.kill()
    return [got[r] for r in range(world_size)]
