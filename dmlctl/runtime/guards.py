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
* **strategies with parameter servers**: a script that calls
  ``torch.distributed.init_process_group`` itself joins a world that counts the
  servers, which never run the script: its first collective would wait for them
  forever. ``dmlctl.init()`` joins through :func:`joining`, which says so in the run's
  store before it joins; once the world has met, each server checks that every rank
  said so (:func:`check_joined`) and fails with the fix if one did not.

Both failures reach the dashboard as the run's root cause, with the fix in the message.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from dmlctl.runtime.after_import import after_import

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
def joining(rank: int, servers: bool) -> Iterator[None]:
    """``dmlctl.init()`` joins the process group as ``rank`` inside this block (said
    in the run's store first when the run has parameter ``servers`` and the store is
    up before the world meets: torchrun's, :func:`_agent_store`)."""
    if servers and _agent_store():
        _joined_store().set(_joined_key(rank), "1")
    _state["joining"] = True
    try:
        yield
    finally:
        _state["joining"] = False


def check_joined(world_size: int, strategy: str) -> None:
    """On a parameter server of ``strategy``, once the world has met: raise
    :class:`StrategyNotApplied` if a rank joined it without ``dmlctl.init()`` (every
    rank that joins through it said so before the world could meet). Nothing to check
    without torchrun's store (:func:`_agent_store`): nobody said so there."""
    if not _agent_store():
        return
    own = [r for r in range(world_size) if not _joined_store().check([_joined_key(r)])]
    if own:
        raise StrategyNotApplied(_own_init_message(strategy, own))


def _agent_store() -> bool:
    """Whether the ranks' store is torchrun's, up before any rank joins (under
    ``dmlctl launch`` it always is; a rank 0 that serves the store itself starts it only
    as it joins, so nobody could say anything there before)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _joined_key(rank: int) -> str:
    """The key rank ``rank`` sets as it joins through ``dmlctl.init()`` (per attempt)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"joined/{attempt}/{rank}"


CONNECT_TRIES = 5


def _joined_store() -> Any:
    """A client of the run's store (torchrun's ``MASTER_ADDR:MASTER_PORT``). A connect
    that a signal interrupted is tried again: torch before 2.5 does not retry it."""
    from dmlctl.runtime import rejoin
    from dmlctl.runtime.signed_store import SignedStore

    for attempt in range(CONNECT_TRIES):
        try:
            raw = rejoin.connect(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
            return SignedStore(raw)
        except RuntimeError as exc:  # torch's DistNetworkError
            if "Interrupted system call" not in str(exc) or attempt == CONNECT_TRIES - 1:
                raise
    raise AssertionError("unreachable")


def _no_prepare_message(strategy: str) -> str:
    return (
        f"strategy {strategy!r} was never applied: the script stepped an optimizer "
        "without ctx.prepare(model, optimizer). Call `ctx = dmlctl.init()` and "
        "`model, optimizer = ctx.prepare(model, optimizer)` before training, or set "
        "`strategy: none` in the job file to run the script as plain torchrun would"
    )


def _own_init_message(strategy: str, ranks: list[int]) -> str:
    who = ", ".join(str(r) for r in ranks)
    return (
        f"strategy {strategy!r} runs parameter servers in this process group, but rank "
        f"{who} joined it without dmlctl: replace torch.distributed."
        "init_process_group(...) with `ctx = dmlctl.init()` and wrap the model with "
        "`ctx.prepare(model, optimizer)` (ctx.rank and ctx.world_size count the workers)"
    )


def install(strategy: str, *, needs_runtime: bool) -> None:
    """Arm the optimizer check of the module docstring for ``strategy`` (named in the
    message) when it ``needs_runtime``: once torch's optimizer module is imported
    (by the script's own ``import torch``: never here, :mod:`dmlctl.runtime.after_import`)."""
    if not needs_runtime:
        return

    def check(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if not _state["prepared"]:
            raise StrategyNotApplied(_no_prepare_message(strategy))

    def arm(optim: ModuleType) -> None:
        optim.register_optimizer_step_pre_hook(check)

    after_import("torch.optim.optimizer", arm)
