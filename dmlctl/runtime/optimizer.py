"""The base of every optimizer a strategy wraps around the user's (runtime side only).

* :class:`CommMeter` — bytes sent and seconds spent communicating, per step; every
  strategy reports ``comm_bytes_per_step`` and ``comm_share`` (the window since the
  previous record) and the run's totals so far through it.
* :class:`StrategyOptimizer` — wraps the user's optimizer: ``step()`` runs the local
  step, then the strategy's :meth:`~StrategyOptimizer.communicate` hook when due
  (every ``period`` steps after ``warmup`` synchronous steps). ``param_groups``,
  ``zero_grad`` and ``state`` pass through, so LR schedulers and gradient clipping
  work unchanged; ``state_dict()`` holds the inner optimizer's state *and* the
  strategy's (momentum, center, duals, …), so checkpoints carry both.
  :meth:`~StrategyOptimizer.check_finite` is the divergence guard's parameter check
  (:mod:`dmlctl.runtime.divergence`), called by every strategy after its rounds.
  :meth:`~StrategyOptimizer.finish` ends training: every worker is brought to the
  model the algorithm defines (the average, the center, z, …; ``final: local``
  keeps the replicas as they are).

The strategies (:mod:`dmlctl.strategies`) and the parameter-server worker
(:mod:`dmlctl.ps.worker`) build on it. Only imported on the hosts (it imports torch);
the control plane never imports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from dmlctl.protocol import COMM_TOTALS
from dmlctl.runtime import divergence, schedulers
from dmlctl.runtime.buffers import ExchangedBuffers


class CommMeter:
    """Accumulates communication volume and time; :meth:`metrics` reports the window
    since its previous call and starts a new one, plus the totals since construction.

    The totals (:data:`dmlctl.protocol.COMM_TOTALS`) let the controller compute the
    run's exact averages however many records it missed: bytes / steps and
    seconds / wall time, all counted from this meter's construction to the record.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._started = self._window_start = clock()
        self.bytes = 0
        self.seconds = 0.0
        self.steps = 0
        self._total_bytes = 0
        self._total_seconds = 0.0
        self._total_steps = 0
        self.extra: dict[str, float] = {}

    def add(self, nbytes: int, seconds: float) -> None:
        """Record one communication: ``nbytes`` this worker sent, in ``seconds``."""
        self.bytes += nbytes
        self.seconds += seconds

    def step(self) -> None:
        self.steps += 1

    def metrics(self) -> dict[str, float]:
        """``comm_bytes_per_step``, ``comm_share`` (of wall time), the totals so far
        (:data:`~dmlctl.protocol.COMM_TOTALS`) and any extra values (e.g.
        ``consensus``) since the previous call; only the extra values when no step was
        taken since then (an evaluation record, say)."""
        if self.steps == 0:  # no training step since the last report: nothing to say
            return dict(self.extra)
        now = self._clock()
        wall = max(now - self._window_start, 1e-9)
        self._total_bytes += self.bytes
        self._total_seconds += self.seconds
        self._total_steps += self.steps
        totals = (self._total_bytes, self._total_seconds, self._total_steps, now - self._started)
        out: dict[str, float] = {
            "comm_bytes_per_step": self.bytes / max(self.steps, 1),
            "comm_share": min(1.0, self.seconds / wall),
            **dict(zip(COMM_TOTALS, totals, strict=True)),
            **self.extra,
        }
        self._window_start, self.bytes, self.seconds, self.steps = now, 0, 0.0, 0
        return out


class StrategyOptimizer(torch.optim.Optimizer):
    """The user's optimizer plus a strategy's periodic communication.

    Subclasses implement :meth:`communicate` (called after the local step when
    :meth:`due`), and :meth:`strategy_state` / :meth:`load_strategy_state`.
    ``coupling`` maps the names of the strategy's coupling weights (shown in the
    divergence hint) to the attributes holding them.
    """

    coupling: ClassVar[Mapping[str, str]] = {}

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        *,
        world_size: int,
        period: int = 1,
        warmup: int = 0,
    ) -> None:
        # Deliberately no super().__init__: the Optimizer attributes *are* the inner
        # optimizer's objects (properties below), so schedulers and clipping act on the
        # real thing.
        self.inner = inner
        self.params = list(params)
        self.world_size = world_size
        self.period = period
        self.warmup = warmup
        self.local_steps = 0
        self.meter = CommMeter()
        self.strategy_name = type(self).__name__
        self.tensor_names: dict[int, str] = {}
        self.buffers = ExchangedBuffers()  # the model's, set by bind_names
        self.keep_local = False  # ``final: local``: finish() leaves the replicas alone
        self._finished_at = -1  # local_steps when finish() last ran
        #: A replacement's: the LR schedulers a live worker handed it, given to the
        #: script's schedulers at the first step (:mod:`dmlctl.runtime.schedulers`).
        self.handed_schedulers: schedulers.Handed | None = None

    # The inner optimizer's own, looked up at each use: its load_state_dict (a
    # checkpoint, a replacement's handover) puts new objects in their place.
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.inner.param_groups = groups

    @property
    def state(self) -> Any:
        return self.inner.state

    @state.setter
    def state(self, state: Any) -> None:
        self.inner.state = state

    @property
    def defaults(self) -> dict[str, Any]:
        return self.inner.defaults

    @defaults.setter
    def defaults(self, defaults: dict[str, Any]) -> None:
        self.inner.defaults = defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def due(self) -> bool:
        """Whether the step just taken ends a communication period."""
        if self.local_steps <= self.warmup:
            return True
        return (self.local_steps - self.warmup) % self.period == 0

    def take_schedulers(self, at: int | None = None) -> list[str]:
        """A replacement's first step (its script has made its LR schedulers by now):
        they take the state it was handed (:func:`dmlctl.runtime.schedulers.adopt`,
        ``at`` its own step count); the class names of those that did."""
        handed, self.handed_schedulers = self.handed_schedulers, None
        return [] if handed is None else schedulers.adopt(handed, self, self.inner, at=at)

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        self.take_schedulers()
        self.before_step()
        loss = self.inner.step(closure) if closure is not None else self.inner.step()
        self.local_steps += 1
        self.meter.step()
        if self.world_size > 1 and self.due():
            self.communicate()
        return loss

    def before_step(self) -> None:
        """Hook before the local step (e.g. EASGD adds its elastic force to grads)."""

    def communicate(self) -> None:
        raise NotImplementedError

    def bind_names(self, strategy: str, model: torch.nn.Module) -> None:
        """Name the strategy and ``model``'s parameters and buffers in divergence
        messages, and take its buffers as they are now as the start of the buffer
        rule (:mod:`dmlctl.runtime.buffers`; ``Context.prepare`` calls it with the
        unwrapped model, after the strategy's broadcast)."""
        self.strategy_name = strategy
        named = [*model.named_parameters(), *model.named_buffers()]
        self.tensor_names = {id(t): name for name, t in named}
        self.buffers = ExchangedBuffers.of(model)

    def exchanged_buffers(self, group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
        """The model's buffers this strategy exchanges (:mod:`dmlctl.runtime.buffers`);
        collective over ``group`` (default: every rank) on the first call."""
        return self.buffers.resolve(group)

    def finish(self) -> None:
        """End of training (the data of ``ctx.shard`` ran out, or ``ctx.finish()``):
        every worker ends with the model the algorithm defines (:meth:`final_model`),
        identical on all of them — unless ``final: local``. Collective over the workers
        (every worker calls it after the same number of steps); a second call without
        a step in between does nothing."""
        if self.world_size == 1 or self._finished_at == self.local_steps:
            return
        self._finished_at = self.local_steps
        if not self.keep_local:
            self.final_model()

    def final_model(self) -> None:
        """Bring every worker to the algorithm's model. Default: nothing (strategies
        whose replicas never drift: ssgd, hogwild)."""

    def divergence_advice(self) -> str:
        """The hint of a divergence message: the lr and the coupling weights."""
        weights = {name: float(getattr(self, attr)) for name, attr in self.coupling.items()}
        return divergence.hint(self.inner, weights)

    def check_finite(
        self,
        values: torch.Tensor | Sequence[torch.Tensor],
        layout: Sequence[torch.Tensor] | None = None,
        where: str = "after the communication round",
        step: int | None = None,
    ) -> None:
        """Raise :class:`~dmlctl.runtime.divergence.Diverged` when ``values`` (a flat
        buffer laid out like ``layout``, default the parameters, or a list shaped like
        it) is not finite; one ``isfinite`` and one sync when it is. ``step`` (default
        :attr:`local_steps`, the steps taken) is the optimizer step the round belongs to."""
        divergence.check_tensors(
            values,
            self.params if layout is None else layout,
            self.tensor_names,
            strategy=self.strategy_name,
            step=self.local_steps if step is None else step,
            where=where,
            advice=self.divergence_advice,
        )

    def strategy_state(self) -> dict[str, Any]:
        return {}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        del state

    def state_dict(self) -> dict[str, Any]:
        return {
            "inner": self.inner.state_dict(),
            "strategy": {"local_steps": self.local_steps, **self.strategy_state()},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict["inner"])
        strategy = dict(state_dict.get("strategy", {}))
        self.local_steps = int(strategy.pop("local_steps", 0))
        self.load_strategy_state(strategy)

    def metrics(self) -> dict[str, float]:
        """What :meth:`dmlctl.runtime.context.Context.log` adds for this strategy."""
        return self.meter.metrics()

    def shown_settings(self) -> dict[str, object]:
        """The settings :meth:`__repr__` shows after the inner optimizer, in order
        (name → the value as printed); the base shows ``period``."""
        return {"period": self.period}

    def __repr__(self) -> str:
        """``ClassName(<inner optimizer>, name=value, …)`` with :meth:`shown_settings`."""
        shown = "".join(f", {name}={value}" for name, value in self.shown_settings().items())
        return f"{type(self).__name__}({self.inner!r}{shown})"
