"""The worker's side of a parameter-server strategy (runtime side, torch).

:class:`PSOptimizer` wraps the user's optimizer (see
:class:`~dmlctl.runtime.optimizer.StrategyOptimizer`) and talks to the servers; what
a worker sends, and when, is its subclass's (the generic push modes in
:mod:`dmlctl.ps.modes`: :class:`~dmlctl.ps.modes.DeltaPush` for asgd and ssp,
:class:`~dmlctl.ps.modes.GradientPush` for adadelay; a strategy's own worker in its
package's ``mode`` module: ``ElasticExchange`` for easgd-async, ``ConsensusExchange``
for aadmm, ``SyncGradientPush`` for sync-ps).

A push and a pull carry the worker's **clock**: the number of local steps taken.
Under ``ssp`` the server answers a pull at clock ``c`` only once every worker still
pushing reached ``c − s``; the worker waits in that pull. Metrics: ``clock``,
``min_clock`` (the slowest worker's clock the last answered pull reported),
``comm_bytes_per_step`` and ``comm_share`` (time in push/pull, waiting included).

When the data of ``ctx.shard`` ends, the worker pushes what it has not pushed, tells
the servers it is DONE (it no longer holds back ``ssp`` readers) and makes a *final*
pull, which the servers answer once every worker said DONE (the workers meet there,
not in a collective of their own): every worker ends with the servers' final
parameters, identical on all workers, and the mean of the workers' buffers that change in training
(:mod:`dmlctl.runtime.buffers`). ``ctx.close`` sends CLOSE; the servers stop once
every worker closed.

Checkpoints: the first worker's optimizer state holds every server's state (taken
with a SNAPSHOT request while saving); on resume it restores the servers, and then
every worker continues from the servers' parameters.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dmlctl.ps.bootstrap import Layout
from dmlctl.ps.channel import Pulled, WorkerChannel
from dmlctl.ps.codec import PushCodec
from dmlctl.ps.overlap import CommThread
from dmlctl.ps.server import pack, unpack
from dmlctl.ps.staging import Staging
from dmlctl.runtime import rejoin, schedulers
from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.text import plural

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


@dataclass(frozen=True)
class Wiring:
    """Where a worker's parameter-server optimizer stands, the same for every mode:
    the run context, the parameters' layout over the servers, the channel to them
    (None: a :class:`~dmlctl.ps.channel.WorkerChannel` to the layout's servers; tests
    pass one of their own),
    whether exchanges run in a communication thread (``overlap``), and the
    model-parallel part it pushes and pulls (DistBelief; 0: the whole model)."""

    ctx: Context
    layout: Layout
    channel: WorkerChannel | None = None
    overlap: bool = False
    part: int = 0


class PSOptimizer(StrategyOptimizer):
    """The user's optimizer plus push/pull to the parameter servers (module docstring).

    Subclasses (:mod:`dmlctl.ps.modes`, a strategy's ``mode`` module) implement
    :meth:`step` with the helpers below, and :meth:`flush` when they hold changes not
    pushed yet. ``channel`` defaults to a
    :class:`~dmlctl.ps.channel.WorkerChannel` to the layout's servers (tests pass one
    of their own)."""

    def __init__(
        self, inner: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter], wiring: Wiring
    ) -> None:
        ctx, layout, channel, part = wiring.ctx, wiring.layout, wiring.channel, wiring.part
        super().__init__(inner, params, world_size=ctx.world_size, period=1)
        members = ctx.membership
        assert members is not None
        self.ctx, self.layout = ctx, layout
        self.group = members.group
        #: This worker's model-parallel part (DistBelief; 0: the whole model): the
        #: shards it pushes and pulls, and where their tensors are in ``params``.
        self.part = part
        mine = layout.tensors_of_part(part)
        where = {g: i for i, g in enumerate(mine)}
        self.shapes = [torch.Size(layout.shapes[g]) for g in mine]
        self.shard_ids = layout.shards_of_part(part)
        self.local_plan = {s: [where[i] for i in layout.plan[s]] for s in self.shard_ids}
        #: Runs after every adoption of pulled parameters (DistBelief: tensor-parallel
        #: peers take their replicated tensors from the one that pushes them).
        self.after_adopt: Callable[[], None] | None = None
        if channel is None:
            codec = PushCodec(layout.push, layout.shard_sizes()) if layout.push else None
            channel = WorkerChannel(
                ctx.global_rank,
                layout.servers_by_shard(),
                layout.shard_numel(),
                layout.torch_dtype,
                codec,
            )
        self.channel = channel
        #: Pushes go to the CPU channel through pinned memory, pulls come back to the
        #: model's device (identity on a CPU worker; :mod:`dmlctl.ps.staging`).
        self.staging = Staging(self.params[0].device if self.params else torch.device("cpu"))
        self.reference = [p.detach().clone() for p in self.params]
        self.min_clock = 0
        self.versions: dict[int, int] = dict.fromkeys(self.shard_ids, 0)  # latest read, per shard
        self.pushed_at = 0  # local step of the latest push
        self._bytes_seen = 0
        #: ``restart.mode: in_place``: this worker's LR schedulers kept for a replacement.
        self._mirror = (
            schedulers.Mirror(rejoin.key(f"schedulers/{ctx.global_rank}"))
            if rejoin.in_place() and rejoin.has_store()
            else None
        )
        if rejoin.rejoining():
            self._rejoin()
        self._closed = False
        #: ``overlap: true``: the thread that runs each exchange while the trainer
        #: computes the next step(s) (:meth:`_push_behind`, :meth:`settle`).
        self.comm = CommThread() if wiring.overlap else None
        ctx.on_close(self.close)

    def _rejoin(self) -> None:
        """Started again in place: the clock goes on (a step a batch), and the
        servers' model and the versions it is at (sync-ps tags pushes with them) come
        with one pull."""
        started = time.perf_counter()
        self.local_steps = self.pushed_at = self.ctx.batches_taken
        self._adopt(self._pull(), keep_local=False)
        if self._mirror is not None:
            self.handed_schedulers = self._mirror.read()
        rejoin.say(
            f"rank {self.ctx.global_rank} rejoined: model from server rank "
            f"{', '.join(map(str, self.channel.servers))} "
            f"({self.channel.bytes_received / 2**10:.1f} KiB, "
            f"{time.perf_counter() - started:.2f} s)"
        )

    # ------------------------------------------------------------ communication

    def _timed(self, action: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        result = action()
        moved = self.channel.bytes_sent + self.channel.bytes_received
        self.meter.add(moved - self._bytes_seen, time.perf_counter() - start)
        self._bytes_seen = moved
        return result

    def _push(
        self,
        tensors: Sequence[torch.Tensor],
        *,
        pull: bool = False,
        clock: Mapping[int, int] | None = None,
        lr: float | None = None,
    ) -> list[torch.Tensor] | None:
        """Push ``tensors``; with ``pull`` read the parameters back in the same
        messages (the read follows this very update: see ``WorkerChannel.push``).
        Each push carries ``clock[shard]`` (default: the local steps taken) and
        ``lr`` when given."""
        pulled = self._timed(self._push_job(tensors, pull=pull, clock=clock, lr=lr))
        return self._unpacked(pulled) if pulled is not None else None

    def _push_behind(
        self,
        tensors: Sequence[torch.Tensor],
        *,
        pull: bool = False,
        clock: Mapping[int, int] | None = None,
    ) -> None:
        """:meth:`_push`, run by the communication thread (``overlap: true``) while the
        trainer goes on; :meth:`settle` collects it."""
        assert self.comm is not None, "_push_behind needs overlap"
        self.comm.submit(self._push_job(tensors, pull=pull, clock=clock))

    def _push_job(
        self,
        tensors: Sequence[torch.Tensor],
        *,
        pull: bool,
        clock: Mapping[int, int] | None = None,
        lr: float | None = None,
    ) -> Callable[[], Mapping[int, Pulled] | None]:
        """The push of ``tensors`` as a job: everything it reads from the model is
        taken now (packed copies), so the job may run while the trainer steps."""
        stage = self.staging.to_host
        grads, ready = stage({s: pack(tensors, self.local_plan[s]) for s in self.shard_ids})
        clocks = dict(clock) if clock is not None else self.local_steps
        refs = None
        if self.channel.codec is not None and self.channel.codec.needs_reference:
            refs, refs_ready = stage(
                {s: pack(self.params, self.local_plan[s]) for s in self.shard_ids}
            )
            ready = _both(ready, refs_ready)
        self.pushed_at = self.local_steps

        def job() -> Mapping[int, Pulled] | None:
            ready()  # the copies off the GPU are complete
            pulled = self.channel.push(grads, clocks, pull=pull, lr=lr, references=refs)
            return pulled if pull else None

        return job

    def settle(self) -> None:
        """Wait for the exchange the communication thread runs, if any, and hand what
        it pulled to :meth:`settled` (``overlap: true``). The wait is the
        communication time the trainer sees (``comm_share``)."""
        if self.comm is None or not self.comm.pending:
            return
        pulled = self._timed(self.comm.wait)
        self.settled(self._unpacked(pulled) if pulled is not None else None)

    def settled(self, pulled: list[torch.Tensor] | None) -> None:
        """What the mode does with a background exchange's pull (its subclass's)."""

    def _pull_behind(self) -> None:
        """:meth:`_pull`, run by the communication thread (``overlap: true``)."""
        assert self.comm is not None, "_pull_behind needs overlap"
        clock = self.local_steps
        self.comm.submit(lambda: self.channel.pull(self.shard_ids, clock=clock))

    def _pull(self, *, final: bool = False) -> list[torch.Tensor]:
        clock = self.local_steps
        pulled = self._timed(lambda: self.channel.pull(self.shard_ids, clock, final=final))
        return self._unpacked(pulled)

    def _unpacked(self, pulled: Mapping[int, Pulled]) -> list[torch.Tensor]:
        self.min_clock = min(p.min_clock for p in pulled.values())
        self.versions.update({s: p.version for s, p in pulled.items()})
        return self.unpack_own([pulled[s].flat for s in self.shard_ids])

    def unpack_own(self, flats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """This worker's tensors from the flat contents of its shards (in
        ``shard_ids`` order), on the model's device."""
        mine = unpack(flats, [self.local_plan[s] for s in self.shard_ids], self.shapes)
        return self.staging.to_device(mine)

    def _adopt(self, pulled: Sequence[torch.Tensor], keep_local: bool) -> None:
        """Parameters ← pulled (+ the local change not pushed yet); reference ← pulled."""
        with torch.no_grad():
            for p, r, fresh in zip(self.params, self.reference, pulled, strict=True):
                if keep_local:
                    p.add_(fresh - r)  # p = fresh + (p - r)
                else:
                    p.copy_(fresh)
                r.copy_(fresh)
        self.check_finite(self.params, where="after the pull from the servers")
        if self.after_adopt is not None:
            self.after_adopt()

    def _local_step(self, closure: Callable[[], float] | None) -> Any:
        """The user's optimizer's step, counted (:meth:`_counted`); returns its loss."""
        self._schedulers_taken()
        loss = self.inner.step(closure) if closure is not None else self.inner.step()
        self._counted()
        return loss

    def _schedulers_taken(self) -> None:
        """A replacement's first step: its LR schedulers take its predecessor's state
        (:class:`~dmlctl.runtime.schedulers.Mirror`)."""
        handed = self.handed_schedulers
        # Its predecessor's position is ahead of the kept copy: schedulers catch up.
        if handed is not None and (names := self.take_schedulers(at=self.local_steps)):
            rejoin.say(
                f"rank {self.ctx.global_rank}: LR schedulers {', '.join(names)} go on from "
                f"its predecessor's (kept at its step {handed.steps})"
            )

    def _counted(self) -> None:
        """A step taken: the clock and the meter; with ``restart.mode: in_place`` the
        LR schedulers' state goes to the run's store when due."""
        self.local_steps += 1
        self.meter.step()
        if self._mirror is not None:
            self._mirror.publish(self, self.inner)

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """One training step and the push/pull due with it: the subclass's."""
        raise NotImplementedError

    # ------------------------------------------------------------ end, checkpoints

    def flush(self) -> None:
        """Push what this worker changed and has not pushed yet (nothing by default)."""

    def finish(self) -> None:
        """End of the data (``Context`` calls it): push what is left (:meth:`flush`),
        say DONE, wait for the other workers, pull the final parameters (module
        docstring; ``final: local`` keeps the worker's own). Again without a step in
        between: nothing."""
        if self._finished_at == self.local_steps:
            return
        self._finished_at = self.local_steps
        self.settle()
        self.flush()
        self.channel.done(clock=self.local_steps)
        self.final_pull(self._pull(final=True))  # answered once every worker is done
        if not self.keep_local:
            self.average_buffers()

    def average_buffers(self) -> None:
        """Every worker's buffers that change in training (BatchNorm statistics;
        :mod:`dmlctl.runtime.buffers`) ← their mean over the workers: the servers
        hold parameters only. Collective over the workers."""
        workers = len(self.ctx.membership.workers) if self.ctx.membership else 1
        if rejoin.in_place() and self.buffers.candidates:
            self.ctx.notice(
                "restart.mode: in_place: the buffers that change in training (BatchNorm "
                "statistics) stay each worker's own: a replaced worker cannot average them"
            )
            return
        began = time.perf_counter()
        mean = self.buffers.average(self.group, workers)
        if mean is not None:
            self.meter.add(mean.numel() * mean.element_size(), time.perf_counter() - began)
            self.check_finite(mean, self.buffers.resolve(), "in the final average")

    def final_pull(self, pulled: Sequence[torch.Tensor]) -> None:
        """What :meth:`finish` does with the servers' final parameters: take them
        (unless ``final: local``)."""
        if not self.keep_local:
            self._adopt(pulled, keep_local=False)

    def close(self) -> None:
        """Tell the servers this worker is gone (once), after the exchange in flight."""
        if not self._closed:
            self._closed = True
            if self.comm is not None:
                self.settle()  # the servers must see its push before the CLOSE
                self.comm.close()
            self.channel.close(clock=self.local_steps)

    def strategy_state(self) -> dict[str, Any]:
        """The reference copy; on the first worker also every server's state (after
        the exchange in flight, so the servers hold this worker's pushes)."""
        self.settle()
        state: dict[str, Any] = {
            "reference": [r.clone() for r in self.reference],
            "pushed_at": self.pushed_at,
        }
        if self.channel.codec is not None:  # this worker's error feedback
            state["push_error"] = self.channel.codec.state_dict()
        if self.ctx.rank == 0:
            blobs = [self.channel.snapshot(server) for server in self.layout.servers]
            state["servers"] = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
        return state

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        """Restore the servers (first worker), then every worker continues from the
        servers' parameters (collective over the workers)."""
        own = not rejoin.in_place() or self.ctx.rank == 0  # in place: the first's, shared
        if self.channel.codec is not None and state.get("push_error") and own:
            self.channel.codec.load_state_dict(state["push_error"])
        servers = state.get("servers")
        if self.ctx.rank == 0 and servers is not None:
            if len(servers) != len(self.layout.servers):
                raise RuntimeError(
                    f"the checkpoint holds {plural(len(servers), 'server state')}; this run "
                    f"has {plural(len(self.layout.servers), 'parameter server')}"
                )
            for server, blob in zip(self.layout.servers, servers, strict=True):
                self.channel.restore(server, blob.numpy().tobytes())
        self.pushed_at = self.local_steps
        dist.barrier(group=self.group)
        self._adopt(self._pull(), keep_local=False)

    def metrics(self) -> dict[str, float]:
        out = self.meter.metrics()
        out["clock"] = float(self.local_steps)
        out["min_clock"] = float(self.min_clock)
        return out


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    """One wait for two staged copies."""

    def wait() -> None:
        first()
        second()

    return wait
