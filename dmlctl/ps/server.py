"""The parameter server: holds some shards' parameters and applies pushed gradients.

A shard is a flat 1-D tensor (the concatenation of the parameter tensors the shard
plan gave it, see :func:`pack` / :func:`unpack`). :class:`ParameterServer` keeps, per
shard, the parameters and a **version** (the number of updates applied so far); per
worker a **clock** (the largest clock that worker sent); and, per (worker, shard), the
version that worker last pulled.

Update rule: an :class:`~dmlctl.ps.rules.UpdateRule` applied to each pushed tensor as
it arrives — by default plain SGD (``flat.add_(grad, alpha=-lr)``, exactly what
``torch.optim.SGD`` does without momentum); the strategies use a scaled delta
(asgd, ssp, easgd-async) or AdaDelay's delay-dependent step (see :mod:`~dmlctl.ps.rules`).

**Stale synchronous parallel.** With ``staleness_bound = s``, a PULL sent at clock
``c`` is answered only once every worker still pushing has clock ``>= c - s``
(clocks count a worker's pushes; a worker that said DONE no longer holds readers
back). Until then the request waits in :attr:`ParameterServer.pending`; each answered
read's lead ``c - min_clock`` is at most ``s`` and the largest one is kept in
:attr:`ParameterServer.max_lead`.

**Staleness** of an applied update = the shard's version just before it is applied
minus the version that worker last pulled of that shard (0 when it never pulled: the
worker started from the initial parameters). It is never negative. The server counts
the measured values in :attr:`ParameterServer.staleness_histogram`.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from dmlctl.ps.channel import Message, Op, ServerTransport
from dmlctl.ps.connection import ConnectionLost
from dmlctl.ps.rules import ScaledAdd, UpdateRule
from dmlctl.ps.stats import ServerStats


def pack(tensors: Sequence[torch.Tensor], indices: Iterable[int]) -> torch.Tensor:
    """One new flat tensor: ``tensors[i]`` for ``i`` in ``indices``, in that order
    (an empty tensor of the first tensor's dtype, or float32, when ``indices`` is empty)."""
    parts = [tensors[i].detach().reshape(-1) for i in indices]
    if not parts:
        dtype = tensors[0].dtype if tensors else torch.float32
        return torch.empty(0, dtype=dtype)
    return torch.cat(parts)


def unpack(
    flats: Sequence[torch.Tensor], plan: Sequence[Sequence[int]], shapes: Sequence[torch.Size]
) -> list[torch.Tensor]:
    """Inverse of :func:`pack` over a whole plan: ``flats[k]`` holds the tensors
    ``plan[k]`` (in that order); returns the tensors in index order with ``shapes``.
    Raises :class:`ValueError` when a flat tensor's size does not match its shapes."""
    out: list[torch.Tensor | None] = [None] * len(shapes)
    for flat, shard in zip(flats, plan, strict=True):
        offset = 0
        for i in shard:
            n = shapes[i].numel()
            out[i] = flat[offset : offset + n].reshape(shapes[i])
            offset += n
        if offset != flat.numel():
            raise ValueError(f"flat shard has {flat.numel()} elements, plan says {offset}")
    missing = [i for i, t in enumerate(out) if t is None]
    if missing:
        raise ValueError(f"tensors {missing} are in no shard")
    return [t for t in out if t is not None]


class ParameterServer:
    """Serves the shards ``shards`` (shard id → flat parameters, copied) to the
    workers ``worker_ranks`` through ``channel``.

    ``rule`` updates a shard with a pushed tensor (default: SGD with ``lr``);
    ``staleness_bound`` turns on stale synchronous parallel (None: answer at once).
    """

    def __init__(
        self,
        shards: Mapping[int, torch.Tensor],
        worker_ranks: Iterable[int],
        channel: ServerTransport,
        *,
        lr: float | None = None,
        rule: UpdateRule | None = None,
        staleness_bound: int | None = None,
        elastic: bool = False,
    ) -> None:
        if rule is None:
            if lr is None:
                raise ValueError("give the server an update rule or an SGD lr")
            rule = ScaledAdd(-lr)
        self.params: dict[int, torch.Tensor] = {
            s: t.detach().reshape(-1).clone() for s, t in shards.items()
        }
        self.workers = sorted(set(worker_ranks))
        self.channel = channel
        self.rule = rule
        self.staleness_bound = staleness_bound
        #: ``restart.mode: in_place``: a worker that left (its process died) is waited
        #: for by nobody until its replacement connects; else its loss fails the server.
        self.elastic = elastic
        self.away: set[int] = set()
        self.departures = 0
        #: Seconds a worker may stay away before it is **gone** (``restart.rejoin_wait``:
        #: its host was lost and no host took its rank): from then on it counts as one
        #: that closed, and ``on_gone(worker, True)`` runs; one that comes back after
        #: all is a worker again (``on_gone(worker, False)``). Infinity: away workers
        #: are waited for until the run ends.
        self.gone_after = math.inf
        self.on_gone: Callable[[int, bool], None] | None = None
        self.away_since: dict[int, float] = {}
        self.gone: set[int] = set()
        #: Pushes applied per worker (as its process counts them, see :meth:`membership`)
        #: and those a worker sent that this server never applied (a predecessor of
        #: this server, replaced in place, died with them after its snapshot).
        self.pushes_from: dict[int, int] = {}
        self.pushes_lost = 0
        self.versions: dict[int, int] = dict.fromkeys(self.params, 0)
        self.clocks: dict[int, int] = dict.fromkeys(self.workers, 0)
        self.pulled: dict[tuple[int, int], int] = {}
        self.staleness_histogram: dict[int, int] = {}
        self.shard_staleness_max: dict[int, int] = dict.fromkeys(self.params, 0)
        self.finished: set[int] = set()  # said DONE: not pushing now
        self.closed: set[int] = set()  # said CLOSE: gone
        self.pending: list[Message] = []  # PULLs waiting for the slowest worker
        self.max_lead = 0
        self.stats = ServerStats()

    # ----------------------------------------------------------------- messages

    def min_clock(self) -> int:
        """The smallest clock among workers still pushing (the largest clock of all
        when none is: nobody holds readers back)."""
        active = [
            c for w, c in self.clocks.items() if w not in self.finished and w not in self.away
        ]
        return min(active) if active else max(self.clocks.values(), default=0)

    def handle(self, msg: Message) -> None:
        """Apply one message: PUSH → the rule updates the shard (version + 1,
        staleness recorded; one that asks for the shard back is then queued as a
        read); PULL → reply with the current parameters (for SSP once
        the bound allows) and remember the version the worker now has; DONE / CLOSE
        → the worker stops pushing / leaves; SNAPSHOT / RESTORE → send / load the
        whole state. Every message advances the worker's clock to
        ``max(clock, msg.clock)``. Raises :class:`RuntimeError` for a rank that is
        not one of this server's workers."""
        if msg.worker not in self.clocks:
            raise RuntimeError(f"message from rank {msg.worker}, not a worker of this server")
        self.clocks[msg.worker] = max(self.clocks[msg.worker], msg.clock)
        if msg.op in (Op.HELLO, Op.LEFT):
            self.membership(msg)
        elif msg.op is Op.DONE:
            self.finished.add(msg.worker)
        elif msg.op is Op.CLOSE:
            self.finished.add(msg.worker)
            self.closed.add(msg.worker)
        elif msg.op is Op.PULL:
            self.pending.append(msg)
        elif msg.op is Op.PUSH:
            assert msg.payload is not None
            self.pushes_from[msg.worker] = self.pushes_from.get(msg.worker, 0) + 1
            self.finished.discard(msg.worker)
            self.apply(msg.worker, msg.shard_id, msg.payload)
            if msg.then_pull:
                self.pending.append(msg)
        elif msg.op is Op.SNAPSHOT:
            self.channel.send_blob(msg.worker, dumps(self.state_dict()))
        elif msg.op is Op.RESTORE:
            assert msg.payload is not None
            self.load_state_dict(loads(msg.payload.numpy().tobytes()))
            self.channel.send_blob(msg.worker, b"")
        else:
            raise RuntimeError(f"a server cannot handle {msg.op.name}")
        self._answer_ready()

    def membership(self, msg: Message) -> None:
        """A worker connected (HELLO) or left (LEFT, its connection ended before its
        CLOSE). Either way the reads of an earlier process of that rank are dropped.
        A LEFT fails the server (:class:`~dmlctl.ps.connection.ConnectionLost` naming the
        worker) unless it is :attr:`elastic`; then the worker is away — the slowest
        clock no longer waits for it — until its replacement says HELLO."""
        worker = msg.worker
        self.pending = [m for m in self.pending if m.worker != worker]
        if msg.op is Op.HELLO:  # its pushes so far, as its process counts: lost if more
            self.away.discard(worker)
            self.away_since.pop(worker, None)
            if worker in self.gone:  # back after the others went on without it
                self.gone.discard(worker)
                self.closed.discard(worker)
                self.finished.discard(worker)
                if self.on_gone is not None:
                    self.on_gone(worker, False)
            self.sent_by(worker, msg.sent)
        elif worker not in self.closed:
            if not self.elastic:
                raise ConnectionLost(
                    f"worker rank {worker}: Connection closed by peer before CLOSE"
                )
            self.away.add(worker)
            self.away_since[worker] = time.monotonic()
            self.departures += 1

    def sent_by(self, worker: int, sent: int) -> None:
        """``worker``'s process says it sent this server ``sent`` pushes: those this
        server never applied (its predecessor died with them) are lost and counted."""
        self.pushes_lost += max(0, sent - self.pushes_from.get(worker, 0))
        self.pushes_from[worker] = sent

    def drop_gone(self, now: float) -> None:
        """The workers away for :attr:`gone_after` seconds by ``now`` are gone: they
        count as closed (the server ends without them, the final reads stop waiting
        for them) and :attr:`on_gone` is told of each."""
        for worker, since in sorted(self.away_since.items()):
            if now - since < self.gone_after:
                continue
            del self.away_since[worker]
            self.away.discard(worker)
            self.gone.add(worker)
            self.finished.add(worker)
            self.closed.add(worker)
            if self.on_gone is not None:
                self.on_gone(worker, True)
        self._answer_ready()

    def _answer_ready(self) -> None:
        """Reply to every pending PULL the staleness bound now allows."""
        if not self.pending:
            return
        low = self.min_clock()
        waiting: list[Message] = []
        for msg in self.pending:
            if self.held(msg) or (
                self.staleness_bound is not None and msg.clock - low > self.staleness_bound
            ):
                waiting.append(msg)
                continue
            self.max_lead = max(self.max_lead, msg.clock - low)
            self._reply(msg, low)
        self.pending = waiting

    def held(self, msg: Message) -> bool:
        """Whether ``msg`` is a final read (the end of a worker's data) that waits
        for the workers that have not said DONE yet."""
        return msg.final and not self.finished.issuperset(self.workers)

    def _reply(self, msg: Message, low: int) -> None:
        """Send the shard ``msg`` reads at its current version (remembered as the
        version that worker now has), with ``low`` as the reply's ``min_clock``."""
        version = self.versions[msg.shard_id]
        self.pulled[(msg.worker, msg.shard_id)] = version
        flat = self.params[msg.shard_id]
        try:
            self.channel.reply(msg.worker, msg.shard_id, version, flat, low)
        except ConnectionLost:
            if not self.elastic:
                raise
            return  # the worker is gone: its LEFT follows
        self.stats.pulled(flat.numel() * flat.element_size())

    def apply(self, worker: int, shard_id: int, update: torch.Tensor) -> int:
        """Apply ``update`` to the shard with the rule; returns the measured staleness
        (>= 0) and counts it."""
        version = self.versions[shard_id]
        staleness = version - self.pulled.get((worker, shard_id), 0)
        self.rule.apply(shard_id, self.params[shard_id], update.reshape(-1), version, staleness)
        self.versions[shard_id] = version + 1
        self.staleness_histogram[staleness] = self.staleness_histogram.get(staleness, 0) + 1
        self.shard_staleness_max[shard_id] = max(self.shard_staleness_max[shard_id], staleness)
        self.stats.pushed(update.numel() * update.element_size(), staleness)
        return staleness

    def serve(self, on_message: Callable[[], None] | None = None) -> None:
        """Receive and handle messages until every worker sent CLOSE;
        ``on_message`` runs after each one (and after workers away too long were
        found gone, :meth:`drop_gone`)."""
        while len(self.closed) < len(self.workers):
            due = min(self.away_since.values(), default=math.inf) + self.gone_after
            now = time.monotonic()
            if due <= now:
                self.drop_gone(now)
            elif (msg := self.channel.receive(None if due == math.inf else due - now)) is not None:
                self.handle(msg)
            if on_message is not None:
                on_message()

    # ----------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: parameters (copies), versions, clocks, the
        versions each worker last pulled, the staleness histogram and the rule's
        state. Plain dicts, lists and tensors (``torch.save`` / ``weights_only``
        loading works)."""
        return {
            "params": {s: t.clone() for s, t in self.params.items()},
            "versions": dict(self.versions),
            "clocks": dict(self.clocks),
            "pulled": [[w, s, v] for (w, s), v in sorted(self.pulled.items())],
            "staleness_histogram": dict(self.staleness_histogram),
            "shard_staleness_max": dict(self.shard_staleness_max),
            "rule": self.rule.state_dict(),
            "pushes_from": dict(self.pushes_from),
            "pushes_lost": self.pushes_lost,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output. The shard ids and sizes must match this
        server's (raises :class:`ValueError` otherwise); the parameters are copied
        in place. Clocks are kept only for workers this server has (a run resumed
        with fewer workers); finished workers and waiting reads are not part of the
        state."""
        params: Mapping[int, torch.Tensor] = state["params"]
        if set(params) != set(self.params):
            raise ValueError(f"state holds shards {sorted(params)}, server {sorted(self.params)}")
        for s, t in params.items():
            if t.numel() != self.params[s].numel():
                raise ValueError(
                    f"shard {s}: state has {t.numel()} elements, server {self.params[s].numel()}"
                )
        for s, t in params.items():
            self.params[s].copy_(t.reshape(-1))
        self.versions = {int(s): int(v) for s, v in state["versions"].items()}
        saved = {int(w): int(c) for w, c in state["clocks"].items()}
        self.clocks = {w: saved.get(w, 0) for w in self.workers}
        self.pulled = {
            (int(w), int(s)): int(v) for w, s, v in state["pulled"] if int(w) in self.clocks
        }
        self.staleness_histogram = {int(k): int(v) for k, v in state["staleness_histogram"].items()}
        saved_max = {int(k): int(v) for k, v in state.get("shard_staleness_max", {}).items()}
        self.shard_staleness_max = {s: saved_max.get(s, 0) for s in self.params}
        if "rule" in state:
            self.rule.load_state_dict(state["rule"])
        self.pushes_from = {int(w): int(n) for w, n in state.get("pushes_from", {}).items()}
        self.pushes_lost = int(state.get("pushes_lost", 0))
        self.finished = set()


def dumps(state: Mapping[str, Any]) -> bytes:
    """``state`` as bytes (``torch.save``)."""
    buf = io.BytesIO()
    torch.save(dict(state), buf)
    return buf.getvalue()


def loads(blob: bytes) -> dict[str, Any]:
    """Inverse of :func:`dumps`; only plain data is accepted (``weights_only``)."""
    state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"server state is a {type(state).__name__}, not a dict")
    return state
