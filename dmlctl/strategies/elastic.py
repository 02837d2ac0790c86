"""Model averaging over a group that outlives a lost worker (``restart.mode:
in_place`` under ``local-sgd`` and ``bmuf``).

The workers average over a gloo process group of their own, made from the run's store
(:func:`dmlctl.runtime.rejoin.store`) under a prefix per **generation**, not over the
default group: that one cannot lose a member. When a worker dies, the next collective
of the others fails (gloo reads the broken connection); each of them then makes the
next generation's group — same ranks, same size — which waits, as gloo's rendezvous
does, until every rank is there: the survivors and the lost worker's replacement,
forked again by its torchrun (:mod:`dmlctl.agent.respawn`). gloo tells only the dead
worker's ring neighbours (the others would wait out the whole timeout), so the first
member to see the loss marks the generation broken in the store, and every member
waits in its collectives in short slices, looking at that mark in between. The replacement knows its
generation from the store, where every worker writes the one it joined.

A round is one all-reduce of the flat tensors, each times a weight, and one of the
weights and the weighted step: a replacement joins with weight 0 at the round the
others retry, so the mean is the survivors' and it receives it — the model — and the
round's step from live peers, nothing from disk. The round is then complete on every
member and the world whole again (:func:`begin`). Tensors every member holds alike
(BMUF's global model and block momentum) ride along in the same round: their mean
over the members with weight 1 is their value, which the replacement receives too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

from dmlctl.runtime import rejoin
from dmlctl.strategies.common import assign_flat, flat_params, start_from_rank0

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context
    from dmlctl.runtime.optimizer import CommMeter, StrategyOptimizer

GROUP_TIMEOUT = timedelta(minutes=10)
"""How long a round, or the forming of a generation, waits for every member."""


_LOST = ("Connection reset by peer", "Connection closed by peer", "Read error", "Broken pipe")


def member_lost(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a collective, says a member's connection broke (its
    process died) rather than something else going wrong."""
    return any(mark in str(exc) for mark in _LOST)


POLL_S = 0.25
"""How often a member waiting in a collective looks whether its generation broke."""


class MemberLost(Exception):
    """Another member found this generation's group broken."""


class ElasticAverager:
    """Worker ``rank`` of ``world``'s rounds over the generations' groups (module
    docstring)."""

    def __init__(self, rank: int, world: int, timeout: timedelta = GROUP_TIMEOUT) -> None:
        self.rank, self.world, self.timeout = rank, world, timeout
        self.store = rejoin.store()
        self._mine = rejoin.key(f"elastic-generation/{rank}")
        found = rejoin.rejoining() and self.store.check([self._mine])
        self.generation = int(self.store.get(self._mine)) + 1 if found else 0
        self.bytes = 0  # sent in all rounds
        self.weight = 0.0  # the latest round's members that brought a model
        self.group = self._form()

    def _form(self) -> Any:
        """This generation's group (blocks until every rank made it); a gloo process
        group of its own, used through its methods (not registered with
        torch.distributed's world)."""
        prefix = rejoin.key(f"elastic/{self.generation}")
        group = dist.ProcessGroupGloo(
            PrefixStore(prefix, self.store), self.rank, self.world, self.timeout
        )
        self.store.set(self._mine, str(self.generation))
        return group

    def average(
        self,
        tensors: Sequence[torch.Tensor],
        step: int,
        meter: CommMeter,
        *,
        joining: bool = False,
    ) -> tuple[torch.Tensor, int]:
        """Every member's ``tensors`` ← their mean over the members that bring a
        model (a replacement ``joining`` brings none), in place; returns the mean and
        the round's step (the others' ``step`` for a replacement). A member lost in
        the round: the next generation is formed and the round done again there.
        ``meter`` counts the round's bytes and time and shows the generation."""
        began = time.perf_counter()
        while True:
            flat = flat_params(tensors)
            weight = 0.0 if joining else 1.0
            flat.mul_(weight)
            meta = torch.tensor([weight, weight * step], dtype=torch.float64)
            try:
                self._wait(self.group.allreduce([flat]))
                self._wait(self.group.allreduce([meta]))
            except (RuntimeError, MemberLost) as exc:
                if not isinstance(exc, MemberLost) and not member_lost(exc):
                    raise
                self._next_generation()
                continue
            if meta[0] <= 0:
                raise RuntimeError("an averaging round with no member bringing a model")
            self.weight = float(meta[0])
            flat /= self.weight
            assign_flat(list(tensors), flat)
            sent = flat.numel() * flat.element_size()
            self.bytes += sent
            meter.add(sent, time.perf_counter() - began)
            meter.extra["generation"] = self.generation
            return flat, round(float(meta[1] / meta[0]))

    def _wait(self, work: Any) -> None:
        """Wait for ``work``, looking every :data:`POLL_S` seconds whether another
        member has found this generation broken: a member whose ring neighbours
        died is not told by gloo (it would wait out the whole timeout). Raises
        :class:`MemberLost` then; what the collective raised otherwise."""
        while True:
            try:
                work.wait(timedelta(seconds=POLL_S))
                return
            except RuntimeError as exc:
                if "Operation timed out" not in str(exc):  # not the poll's own timeout
                    raise
                if self.store.check([self._broken(self.generation)]):
                    raise MemberLost(f"generation {self.generation} broken") from exc

    def _broken(self, generation: int) -> str:
        return rejoin.key(f"elastic/{generation}/broken")

    def _next_generation(self) -> None:
        """A member was lost: mark this generation broken (for the members gloo does
        not tell), then form the next one's group (with the replacement)."""
        self.store.set(self._broken(self.generation), "1")
        self.generation += 1
        self.group = self._form()


def averager(ctx: Context) -> ElasticAverager | None:
    """This worker's elastic group in a run that replaces workers in place (None
    otherwise, or alone)."""
    if not rejoin.in_place() or ctx.world_size == 1:
        return None
    return ElasticAverager(ctx.rank, ctx.world_size)


def starting_weights(ctx: Context, model: torch.nn.Module) -> list[torch.nn.Parameter] | None:
    """``model``'s parameters as a strategy starts from them: rank 0's
    (:func:`~dmlctl.strategies.common.start_from_rank0`, None alone), or as they are
    in a replacement (its first round brings the model)."""
    if rejoin.in_place() and rejoin.rejoining() and ctx.world_size > 1:
        return list(model.parameters())
    return start_from_rank0(ctx, model)


def begin(
    ctx: Context,
    opt: StrategyOptimizer,
    elastic: ElasticAverager,
    strategy: str,
    first_round: Callable[[], int],
) -> None:
    """An optimizer with an elastic group starts: a replacement runs ``first_round``
    (the round its peers retry, with weight 0; it returns the round's step), and its
    step count and data go on there; said once that the buffers stay local."""
    if rejoin.rejoining():
        started = time.perf_counter()
        step = first_round()
        opt.local_steps = step
        ctx.go_on_at(step)
        rejoin.say(
            f"rank {ctx.rank} rejoined at step {step}: peers' mean (generation "
            f"{elastic.generation}, {elastic.bytes / 2**10:.1f} KiB, "
            f"{time.perf_counter() - started:.2f} s)"
        )
    if opt.buffers.candidates:
        ctx.notice(
            f"restart.mode: in_place: {strategy} averages the parameters only; the "
            "buffers that change in training (BatchNorm statistics) stay each worker's own"
        )
