"""Parameter servers that apply updates in rounds (runtime side, torch).

The asynchronous servers (:mod:`dmlctl.ps.server`) apply every push the moment it
arrives. Two strategies need the server to *collect* pushes and apply them together,
once a condition on who has reported holds:

* :class:`BackupRounds` (``sync-ps``, Chen et al. 2016, "Revisiting distributed
  synchronous SGD"): workers push the gradient of the parameters at version ``t``
  tagged ``t``. The server keeps the gradients tagged with its current version and,
  as soon as ``K − b`` of them are in (``b`` backup workers; fewer when fewer workers
  are still training), steps the user's optimizer once on their mean, with the
  learning rate the latest accepted push carried (the workers' schedule): version
  ``t + 1``. A gradient that arrives tagged with an older version is dropped and
  counted. With ``b = 0`` this is synchronous SGD with averaged gradients.
* :class:`ConsensusRounds` (``aadmm``, Zhang & Kwok 2014, "Asynchronous distributed
  ADMM for consensus optimization"): worker ``k`` pushes ``v_k = w_k + λ_k/ρ``; the
  server keeps every worker's latest ``v_k`` and updates ``z ← mean_k v_k`` once at
  least ``K₀`` workers (fewer when fewer are still training) have reported since the
  last update **and** every worker that has not reported has missed fewer than ``τ``
  updates of ``z`` (its *delay*): a worker whose delay reached ``τ`` is waited for,
  so no delay ever exceeds ``τ``.

A worker's push that asks for the shard back (``then_pull``) is answered once the
round it took part in is over (its gradient applied or dropped, its ``v_k`` folded
into ``z``); a plain PULL is answered at once.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Collection, Mapping
from typing import Any, Protocol

import torch

from dmlctl.ps.channel import Message, Op, ServerTransport
from dmlctl.ps.server import ParameterServer


class RoundRule(Protocol):
    """What a :class:`RoundServer` asks of its rule (per shard)."""

    def offer(self, push: Message, version: int) -> bool:
        """Take the PUSH ``push`` (its worker's update for its shard, tagged with its
        ``clock``, with its ``lr`` when it sent one) while the shard is at ``version``;
        False when it is dropped."""
        ...

    def waiting(self, push: Message, version: int) -> bool:
        """Whether the read that ``push`` asked for (``then_pull``) must still wait
        while its shard is at ``version``."""
        ...

    def ready(self, shard_id: int, active: Collection[int]) -> bool:
        """Whether the round can be applied now (``active``: workers still training)."""
        ...

    def close(self, shard_id: int, flat: torch.Tensor, active: Collection[int]) -> None:
        """Apply the round to ``flat`` in place and start the next one."""
        ...

    def apply(
        self, shard_id: int, flat: torch.Tensor, update: torch.Tensor, version: int, staleness: int
    ) -> None:
        """Not used: round rules apply in :meth:`close`."""
        ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class _RoundsOnly:
    """The :class:`~dmlctl.ps.rules.UpdateRule` side of a round rule: pushes never
    go through ``apply``."""

    def apply(
        self, shard_id: int, flat: torch.Tensor, update: torch.Tensor, version: int, staleness: int
    ) -> None:
        del shard_id, flat, update, version, staleness
        raise RuntimeError("a round rule applies its updates when the round closes")


def make_optimizer(
    name: str, flat: torch.Tensor, settings: Mapping[str, Any]
) -> torch.optim.Optimizer:
    """``torch.optim.<name>`` over ``flat`` (as one parameter sharing its memory)
    with ``settings``, keeping only the arguments its constructor takes."""
    cls = getattr(torch.optim, name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ValueError(f"torch.optim has no optimizer {name!r}")
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in settings.items() if k in accepted and k != "params"}
    return cls([torch.nn.Parameter(flat)], **kwargs)


def _flat_copy(push: Message) -> torch.Tensor:
    """A PUSH's payload as a 1-D copy the rule can keep."""
    assert push.payload is not None
    return push.payload.detach().reshape(-1).clone()


class BackupRounds(_RoundsOnly):
    """Synchronous SGD with ``backup`` backup workers (module docstring): the servers
    step ``torch.optim.<optimizer>`` with ``settings`` on the mean of the first
    ``workers − backup`` gradients of each version."""

    def __init__(
        self, workers: int, backup: int, optimizer: str, settings: Mapping[str, Any]
    ) -> None:
        if not 0 <= backup < workers:
            raise ValueError(f"backup workers must be in [0, {workers}), got {backup}")
        self.workers, self.backup = workers, backup
        self.optimizer_name, self.settings = optimizer, dict(settings)
        self.grads: dict[int, dict[int, torch.Tensor]] = {}
        self.optimizers: dict[int, torch.optim.Optimizer] = {}
        self.dropped = 0
        self.dropped_by: dict[int, int] = {}
        self.rounds = 0
        self.lr: float | None = None  # the latest accepted push's lr (the workers' schedule)
        self._pending_state: dict[int, Any] = {}

    def offer(self, push: Message, version: int) -> bool:
        """Keep the gradient when its tag (clock) is the shard's ``version``, else
        drop it, and count it when it is late (one tagged ahead is of a round a
        replaced server's snapshot never reached: lost, not late)."""
        if push.clock != version:
            if push.clock < version:
                self.dropped += 1
                self.dropped_by[push.worker] = self.dropped_by.get(push.worker, 0) + 1
            return False
        self.grads.setdefault(push.shard_id, {})[push.worker] = _flat_copy(push)
        if push.lr is not None:
            self.lr = push.lr
        return True

    def waiting(self, push: Message, version: int) -> bool:
        """Until the round the push was tagged for is over. A push tagged ahead of
        the shard's version (a replacement server restored an older snapshot: the
        rounds since are lost) is answered at once with the shard as it is."""
        return version == push.clock

    def ready(self, shard_id: int, active: Collection[int]) -> bool:
        have = len(self.grads.get(shard_id, {}))
        return have > 0 and have >= min(self.workers - self.backup, len(active))

    def close(self, shard_id: int, flat: torch.Tensor, active: Collection[int]) -> None:
        del active
        got = self.grads.pop(shard_id)
        mean = torch.stack([got[w] for w in sorted(got)]).sum(dim=0) / len(got)
        opt = self._optimizer(shard_id, flat)
        if self.lr is not None:
            opt.param_groups[0]["lr"] = self.lr
        param = opt.param_groups[0]["params"][0]
        param.grad = mean.to(param.dtype)
        opt.step()
        param.grad = None
        self.rounds += 1

    def _optimizer(self, shard_id: int, flat: torch.Tensor) -> torch.optim.Optimizer:
        opt = self.optimizers.get(shard_id)
        if opt is None:
            opt = self.optimizers[shard_id] = make_optimizer(
                self.optimizer_name, flat, self.settings
            )
            saved = self._pending_state.pop(shard_id, None)
            if saved is not None:
                opt.load_state_dict(saved)
        return opt

    def metrics(self) -> dict[str, float]:
        return {"dropped": float(self.dropped), "rounds": float(self.rounds)}

    def state_dict(self) -> dict[str, Any]:
        optimizers = {s: o.state_dict() for s, o in self.optimizers.items()}
        return {
            "optimizers": {**self._pending_state, **optimizers},
            "dropped": self.dropped,
            "dropped_by": dict(self.dropped_by),
            "rounds": self.rounds,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.dropped = int(state.get("dropped", 0))
        self.dropped_by = {int(w): int(n) for w, n in state.get("dropped_by", {}).items()}
        self.rounds = int(state.get("rounds", 0))
        self.grads = {}
        saved = {int(s): o for s, o in state.get("optimizers", {}).items()}
        for s, opt in self.optimizers.items():
            if s in saved:
                opt.load_state_dict(saved.pop(s))
        self._pending_state = saved


class ConsensusRounds(_RoundsOnly):
    """Asynchronous consensus ADMM's z-update (module docstring) over ``workers``
    workers (global ranks), with partial barrier ``min_workers`` (K₀) and delay
    bound ``max_delay`` (τ)."""

    def __init__(self, workers: Collection[int], min_workers: int, max_delay: int) -> None:
        if not 1 <= min_workers <= len(workers) or max_delay < 1:
            raise ValueError(
                f"need 1 <= min_workers <= {len(workers)} and max_delay >= 1, "
                f"got {min_workers} and {max_delay}"
            )
        self.workers = sorted(workers)
        self.min_workers, self.max_delay = min_workers, max_delay
        self.latest: dict[int, dict[int, torch.Tensor]] = {}  # shard → worker → v_k
        self.start: dict[int, torch.Tensor] = {}  # shard → z₀ (v_k of a silent worker)
        self.reported: dict[int, set[int]] = {}
        self.delays: dict[int, dict[int, int]] = {}  # shard → worker → updates missed
        self.delay_histogram: dict[int, int] = {}  # delay → count, every worker every update
        self.worst_delay = 0
        self.rounds = 0

    def offer(self, push: Message, version: int) -> bool:
        """Keep the worker's latest ``v_k`` (never dropped)."""
        del version
        self.latest.setdefault(push.shard_id, {})[push.worker] = _flat_copy(push)
        self.reported.setdefault(push.shard_id, set()).add(push.worker)
        return True

    def waiting(self, push: Message, version: int) -> bool:
        """Until the next update of z (the worker has reported since the last one)."""
        del version
        return push.worker in self.reported.get(push.shard_id, set())

    def ready(self, shard_id: int, active: Collection[int]) -> bool:
        reported = self.reported.get(shard_id, set())
        if not reported or len(reported) < min(self.min_workers, len(active)):
            return False
        delays = self.delays.get(shard_id, {})
        return all(w in reported or delays.get(w, 0) < self.max_delay for w in active)

    def close(self, shard_id: int, flat: torch.Tensor, active: Collection[int]) -> None:
        start = self.start.setdefault(shard_id, flat.clone())
        latest = self.latest.get(shard_id, {})
        total = torch.zeros_like(flat)
        for w in self.workers:
            total += latest.get(w, start)
        flat.copy_(total / len(self.workers))
        reported = self.reported.pop(shard_id, set())
        delays = self.delays.setdefault(shard_id, {})
        for w in self.workers:
            if w in reported:
                delays[w] = 0
            elif w in active:
                delays[w] = delays.get(w, 0) + 1
            d = delays.get(w, 0)
            self.delay_histogram[d] = self.delay_histogram.get(d, 0) + 1
            self.worst_delay = max(self.worst_delay, d)
        self.rounds += 1

    def note_start(self, shard_id: int, flat: torch.Tensor) -> None:
        """Remember z₀ (the shard before any update): the ``v_k`` of a worker that has
        not reported yet."""
        self.start.setdefault(shard_id, flat.clone())

    def metrics(self) -> dict[str, float]:
        now = [d for per in self.delays.values() for d in per.values()]
        return {
            "delay_max": float(self.worst_delay),
            "delay_now": float(max(now, default=0)),
            "rounds": float(self.rounds),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "latest": {s: {w: t.clone() for w, t in per.items()} for s, per in self.latest.items()},
            "start": {s: t.clone() for s, t in self.start.items()},
            "delays": {s: dict(per) for s, per in self.delays.items()},
            "delay_histogram": dict(self.delay_histogram),
            "worst_delay": self.worst_delay,
            "rounds": self.rounds,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.latest = {
            int(s): {int(w): t.clone() for w, t in per.items()}
            for s, per in state.get("latest", {}).items()
        }
        self.start = {int(s): t.clone() for s, t in state.get("start", {}).items()}
        self.delays = {
            int(s): {int(w): int(d) for w, d in per.items()}
            for s, per in state.get("delays", {}).items()
        }
        self.delay_histogram = {int(k): int(v) for k, v in state.get("delay_histogram", {}).items()}
        self.worst_delay = int(state.get("worst_delay", 0))
        self.rounds = int(state.get("rounds", 0))
        self.reported = {}


class RoundServer(ParameterServer):
    """A :class:`~dmlctl.ps.server.ParameterServer` whose pushes are collected by a
    :class:`RoundRule` and applied when its round closes (module docstring).
    Versions count rounds; a push's clock is the version its worker last read."""

    def __init__(
        self,
        shards: Mapping[int, torch.Tensor],
        worker_ranks: Collection[int],
        channel: ServerTransport,
        *,
        rule: RoundRule,
        elastic: bool = False,
    ) -> None:
        super().__init__(shards, worker_ranks, channel, rule=rule, elastic=elastic)
        self.rounds_rule = rule
        if isinstance(rule, ConsensusRounds):
            for s, flat in self.params.items():
                rule.note_start(s, flat)

    def handle(self, msg: Message) -> None:
        """A PUSH is offered to the rule (its read queued when it asks for one);
        every other message as :meth:`ParameterServer.handle` does it, without
        moving the worker's clock (here: the version its latest push was tagged
        with, so ``clock_spread`` is how many rounds the slowest worker is behind)."""
        if msg.op is not Op.PUSH or msg.worker not in self.clocks:
            if msg.worker in self.clocks:  # a DONE or PULL counts steps, not versions
                msg = dataclasses.replace(msg, clock=self.clocks[msg.worker])
            super().handle(msg)
            return
        assert msg.payload is not None
        self.clocks[msg.worker] = max(self.clocks[msg.worker], msg.clock)
        self.pushes_from[msg.worker] = self.pushes_from.get(msg.worker, 0) + 1
        self.finished.discard(msg.worker)
        version = self.versions[msg.shard_id]
        self.rounds_rule.offer(msg, version)
        lag = max(version - msg.clock, 0)
        self.staleness_histogram[lag] = self.staleness_histogram.get(lag, 0) + 1
        self.stats.pushed(msg.payload.numel() * msg.payload.element_size(), lag)
        if msg.then_pull:
            self.pending.append(msg)
        self._answer_ready()

    def _answer_ready(self) -> None:
        """Close every round the rule allows, then answer the reads no longer waiting.
        A worker away (``restart.mode: in_place``: lost, its replacement not yet
        there) is not waited for: sync-ps closes its rounds with the others'
        gradients, as with a backup worker; aadmm counts no delay for it."""
        active = [w for w in self.workers if w not in self.finished and w not in self.away]
        for s, flat in self.params.items():
            if self.rounds_rule.ready(s, active):
                self.rounds_rule.close(s, flat, active)
                self.versions[s] += 1
        waiting: list[Message] = []
        low = self.min_clock()
        for msg in self.pending:
            version = self.versions[msg.shard_id]
            if self.held(msg) or (msg.then_pull and self.rounds_rule.waiting(msg, version)):
                waiting.append(msg)
            else:
                self._reply(msg, low)
        self.pending = waiting
