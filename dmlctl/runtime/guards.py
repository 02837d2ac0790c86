"""Refuse to train without the job's strategy when the strategy needs the runtime.

A job that names, say, ``local-sgd`` but runs a script that never calls
``ctx.prepare`` would otherwise train with plain DDP (or alone) and report local-sgd.
The runtime entry calls :func:`install` before the script runs; then:

* **every strategy that needs the runtime** (the caller says so, from
  :func:`dmlctl.strategies.registry.needs_runtime`: all but ``none``, and ``ssgd``
  with its default parameters): the first ``optimizer.step()``
  of any optimizer raises :class:`StrategyNotApplied` unless ``ctx.prepare`` ran
  first — before a single update is applied (afterwards the check is one dict lookup
  per step).
* **strategies with parameter servers**: ``torch.distributed.init_process_group``
  called by the script itself raises at once (the world counts the servers, which
  never run the script); ``dmlctl.init()`` joins through :func:`joining`.

Both failures reach the dashboard as the run's root cause, with the fix in the message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

_state = {"prepared": False, "joining": False}


class StrategyNotApplied(RuntimeError):
    """The script trains without the strategy the job asked for."""


def mark_prepared() -> None:
    """``ctx.prepare`` applied the strategy (called by the context)."""
    _state["prepared"] = True


def is_prepared() -> bool:
    """Whether ``ctx.prepare`` has applied the strategy (training steps come next)."""
    return bool(_state["prepared"])


def is_joining() -> bool:
    """Whether ``dmlctl.init()`` is joining the process group now."""
    return bool(_state["joining"])


@contextlib.contextmanager
def joining() -> Iterator[None]:
    """``dmlctl.init()`` joins the process group inside this block."""
    _state["joining"] = True
    try:
        yield
    finally:
        _state["joining"] = False


def _no_prepare_message(strategy: str) -> str:
    return (
        f"strategy {strategy!r} was never applied: the script stepped an optimizer "
        "without ctx.prepare(model, optimizer). Call `ctx = dmlctl.init()` and "
        "`model, optimizer = ctx.prepare(model, optimizer)` before training, or set "
        "`strategy: none` in the job file to run the script as plain torchrun would"
    )


def _own_init_message(strategy: str) -> str:
    return (
        f"strategy {strategy!r} runs parameter servers in this process group, so the "
        "script must join it through dmlctl: replace torch.distributed."
        "init_process_group(...) with `ctx = dmlctl.init()` and wrap the model with "
        "`ctx.prepare(model, optimizer)` (ctx.rank and ctx.world_size count the workers)"
    )


def install(strategy: str, *, servers: bool, needs_runtime: bool) -> None:
    """Arm the checks of the module docstring for ``strategy`` (named in the messages):
    none unless it ``needs_runtime``; the check on joining the process group too when
    the run has parameter ``servers``. Imports torch only when there is something to
    check."""
    if not needs_runtime:
        return
    import torch.optim.optimizer as optim

    def check(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if not _state["prepared"]:
            raise StrategyNotApplied(_no_prepare_message(strategy))

    optim.register_optimizer_step_pre_hook(check)
    if servers:
        _guard_init(strategy)


def _guard_init(strategy: str) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original: Callable[..., Any] = c10d.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if not _state["joining"]:
            raise StrategyNotApplied(_own_init_message(strategy))
        return original(*args, **kwargs)

    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    c10d.init_process_group = init_process_group
