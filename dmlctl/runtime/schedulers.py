"""The user's learning-rate schedulers, handed to a worker replaced in place.

A replacement (``restart.mode: in_place``) is handed a live worker's optimizer state,
but a scheduler is the script's own object, made after ``ctx.prepare`` as often as
before it, and the optimizer holds no reference to it: its counter would start again
at 0 and set the learning rate of the schedule's first step. :meth:`Handed.of` finds
the schedulers that drive an optimizer (a strategy's or the one inside it) among the
process's objects and takes their ``state_dict()``; :func:`adopt`, in the
replacement, loads them into its own schedulers of the same kinds at its first step
(its script has made them by then) and sets the learning rates the live worker had,
so the schedule goes on where the live worker's was. A parameter-server worker has
no live peer to copy: its schedulers' state is kept in the run's store as it trains
(:class:`Mirror`), and its replacement takes that.
"""

from __future__ import annotations

import dataclasses
import gc
import io
import math
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from dmlctl.runtime import rejoin, store_blobs


def of(*optimizers: torch.optim.Optimizer) -> list[LRScheduler]:
    """The LR schedulers of this process that drive one of ``optimizers`` (a
    ``SequentialLR`` or ``ChainedScheduler``, not the schedulers inside it: it loads
    and steps them), with at most one of each class: several of a class could not be
    told apart in another process (said, and left out)."""
    gc.collect()  # schedulers no longer referenced are no one's
    wanted = [id(o) for o in optimizers]
    found = [
        obj
        for obj in gc.get_objects()
        if LRScheduler in type(obj).__mro__ and id(getattr(obj, "optimizer", None)) in wanted
    ]
    inner = {id(child) for s in found for child in getattr(s, "_schedulers", ())}
    mine = [s for s in found if id(s) not in inner]
    kinds = [type(s).__name__ for s in mine]
    twice = sorted({kind for kind in kinds if kinds.count(kind) > 1})
    if twice:
        rejoin.say(
            f"LR schedulers {', '.join(twice)}: more than one of a kind on the optimizer, "
            "not handed over (each starts again in a replacement)"
        )
    return [s for s in mine if type(s).__name__ not in twice]


@dataclass(frozen=True)
class Handed:
    """What a live worker hands a replacement of its schedulers: each one's class name
    and ``state_dict()`` (a lambda's scheduler leaves its functions out), the
    learning rates of the optimizer's groups, and the steps it had taken."""

    states: list[tuple[str, dict[str, Any]]]
    rates: list[float]
    steps: int
    unsent: list[str]  # the schedulers whose state is no plain data (their class names)

    @classmethod
    def of(cls, optimizer: torch.optim.Optimizer, *also: torch.optim.Optimizer) -> Handed:
        """What ``optimizer`` (a strategy's, with ``steps`` counted) and ``also`` hand on."""
        return cls.taken(of(optimizer, *also), optimizer)

    @classmethod
    def taken(cls, found: list[LRScheduler], optimizer: torch.optim.Optimizer) -> Handed:
        """What the schedulers ``found`` of ``optimizer`` hand on."""
        states: list[tuple[str, dict[str, Any]]] = []
        unsent: list[str] = []
        for scheduler in found:
            state, name = scheduler.state_dict(), type(scheduler).__name__
            if _plain(state):
                states.append((name, state))
            else:
                unsent.append(name)
        rates = [float(group["lr"]) for group in optimizer.param_groups]
        return cls(states, rates, int(getattr(optimizer, "local_steps", 0)), unsent)

    def to_state(self) -> dict[str, Any]:
        """As plain data (``torch.save`` with ``weights_only`` loading)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Handed:
        states = [(str(kind), dict(saved)) for kind, saved in state["states"]]
        rates = [float(r) for r in state["rates"]]
        return cls(states, rates, int(state["steps"]), [str(n) for n in state["unsent"]])


class Mirror:
    """A parameter-server worker's schedulers in the run's store, for its replacement
    (which has no live peer to hand them over): at most every
    :data:`~dmlctl.runtime.rejoin.MIRROR_S` seconds, as its data position is (the
    schedulers are looked for once, at the first step: one made later is not kept)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._found: list[weakref.ref[LRScheduler]] | None = None
        self._last = -math.inf

    def publish(self, optimizer: torch.optim.Optimizer, *also: torch.optim.Optimizer) -> None:
        """Write the state of ``optimizer``'s (and ``also``'s) schedulers when due."""
        now = time.monotonic()
        if now - self._last < rejoin.MIRROR_S:
            return
        self._last = now
        if self._found is None:
            self._found = [weakref.ref(s) for s in of(optimizer, *also)]
        live = [s for ref in self._found if (s := ref()) is not None]
        if live:
            buf = io.BytesIO()
            torch.save(Handed.taken(live, optimizer).to_state(), buf)
            store_blobs.put(rejoin.store(), self.key, buf.getvalue())

    def read(self) -> Handed | None:
        """What the predecessor last wrote (None: nothing)."""
        data = store_blobs.get(rejoin.store(), self.key)
        if data is None:
            return None
        return Handed.from_state(torch.load(io.BytesIO(data), weights_only=True))


def _plain(state: dict[str, Any]) -> bool:
    """Whether ``state`` goes through ``torch.save`` and a ``weights_only`` load (a
    ``LambdaLR`` of a callable object keeps that object's attributes, of any type)."""
    buf = io.BytesIO()
    try:
        torch.save(state, buf)
        buf.seek(0)
        torch.load(buf, weights_only=True)
    except Exception:
        return False
    return True


def adopt(
    handed: Handed,
    optimizer: torch.optim.Optimizer,
    *also: torch.optim.Optimizer,
    at: int | None = None,
) -> list[str]:
    """Load ``handed`` (a live worker's) into this process's schedulers of
    ``optimizer`` (and ``also``), each into one of its class, and set ``optimizer``'s
    learning rates to the live worker's (a new scheduler has set its schedule's
    first). A scheduler that counts steps (its count one behind the live worker's
    steps: that worker was inside the round the replacement joined) then takes that
    round's step, as the live worker's did after it (a scheduler stepped once per
    epoch whose count happens to be that is stepped too: a rare early mismatch of
    one). ``at``: the replacement's own step count, ahead of ``handed.steps`` when the
    state is a kept copy (:class:`Mirror`): a scheduler stepped every step takes the
    steps between too. Returns the class names loaded (a scheduler with no saved
    state of its kind keeps its own)."""
    left = list(handed.states)
    loaded: list[LRScheduler] = []
    for scheduler in of(optimizer, *also):
        name = type(scheduler).__name__
        found = next((i for i, (kind, _) in enumerate(left) if kind == name), None)
        if found is not None:
            scheduler.load_state_dict(left.pop(found)[1])
            loaded.append(scheduler)
    if handed.unsent:
        rejoin.say(
            f"LR scheduler {', '.join(handed.unsent)} starts again: the live worker's state "
            "of it is not plain data (tensors, numbers, strings, lists, dicts)"
        )
    if loaded:
        for group, lr in zip(optimizer.param_groups, handed.rates, strict=False):
            group["lr"] = lr
    with warnings.catch_warnings():  # "step() before optimizer.step()": as the live one did
        warnings.simplefilter("ignore", UserWarning)
        for scheduler in loaded:
            if not _counts_steps(scheduler) or handed.steps <= 0:
                continue
            if _count(scheduler) == handed.steps - 1:
                scheduler.step()
            if at is not None and _count(scheduler) == handed.steps:  # stepped every step
                for _ in range(at - handed.steps):
                    scheduler.step()
    return [type(s).__name__ for s in loaded]


def _counts_steps(scheduler: LRScheduler) -> bool:
    """Whether ``scheduler`` can take a step by itself (``ReduceLROnPlateau`` needs the
    metric it watches)."""
    return not isinstance(scheduler, ReduceLROnPlateau)


def _count(scheduler: LRScheduler) -> int | None:
    """``scheduler``'s step count (a ``ChainedScheduler`` has none: its first one's)."""
    count = getattr(scheduler, "last_epoch", None)
    children = getattr(scheduler, "_schedulers", None)
    if count is None and children:
        count = getattr(children[0], "last_epoch", None)
    return count if isinstance(count, int) else None
