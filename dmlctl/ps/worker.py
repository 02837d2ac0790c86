"""The worker's side of a parameter-server strategy (runtime side, torch).

:class:`PSOptimizer` wraps the user's optimizer (see
:class:`~dmlctl.strategies.base.StrategyOptimizer`). ``mode`` picks what a worker
sends, ``n_push`` / ``n_fetch`` / ``period`` when:

* ``delta`` (asgd, ssp): the user's optimizer steps locally; every ``n_push`` steps
  the worker pushes its *delta* — its parameters minus the reference copy taken at
  its last push or pull — and the server adds it with the layout's weight; every
  ``n_fetch`` steps it pulls and continues from the server's parameters plus the
  local change not pushed yet. With plain SGD and ``n_push = n_fetch = 1`` the delta
  is ``-lr·g``: Downpour's gradient push. Optimizer state (momentum, Adam moments)
  stays on the worker.
* ``gradient`` (adadelay): the user's optimizer does not step; the worker pushes its
  gradients every step and the server's rule makes the step; it pulls every
  ``n_fetch`` steps.
* ``elastic`` (easgd-async): local steps with the user's optimizer; every ``period``
  steps the worker pulls the center ``x̃``, moves ``x ← x − α(x − x̃)`` and pushes
  ``α(x − x̃)``, which the server adds to the center (the paper's asynchronous
  elastic exchange).

A push and a pull carry the worker's **clock**: the number of local steps taken.
Under ``ssp`` the server answers a pull at clock ``c`` only once every worker still
pushing reached ``c − s``; the worker waits in that pull. Metrics: ``clock``,
``min_clock`` (the slowest worker's clock the last answered pull reported),
``comm_bytes_per_step`` and ``comm_share`` (time in push/pull, waiting included).

When the data of ``ctx.shard`` ends, the worker pushes what it has not pushed, tells
the servers it is DONE (it no longer holds back ``ssp`` readers), waits for the other
workers and pulls: every worker ends with the servers' final parameters, identical on
all workers. ``ctx.close`` sends CLOSE; the servers stop once every worker closed.

Checkpoints: the first worker's optimizer state holds every server's state (taken
with a SNAPSHOT request while saving); on resume it restores the servers, and then
every worker continues from the servers' parameters.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from dmlctl.ps.bootstrap import Layout, share_initial, share_layout
from dmlctl.ps.channel import Pulled, WorkerChannel
from dmlctl.ps.server import pack, unpack
from dmlctl.runtime.context import Context
from dmlctl.strategies.base import StrategyOptimizer

MODES = ("delta", "gradient", "elastic")


def start_worker(ctx: Context, params: Sequence[torch.nn.Parameter], layout: Layout) -> Layout:
    """Bootstrap on a worker: the first worker's ``layout`` and parameters go to every
    rank (collective); this worker's ``params`` are overwritten with the first
    worker's. Returns the layout in force."""
    members = ctx.membership
    assert members is not None
    src = members.workers[0]
    first = ctx.global_rank == src
    layout = share_layout(layout if first else None, src=src)
    if [tuple(p.shape) for p in params] != [tuple(s) for s in layout.shapes]:
        raise RuntimeError(
            f"worker {ctx.rank}: the model's parameter shapes differ from worker 0's "
            "(every worker must build the same model)"
        )
    shards = share_initial(layout, src=src, params=list(params) if first else None)
    fresh = unpack(shards, layout.plan, [torch.Size(s) for s in layout.shapes])
    with torch.no_grad():
        for p, value in zip(params, fresh, strict=True):
            p.copy_(value)
    return layout


class PSOptimizer(StrategyOptimizer):
    """The user's optimizer plus push/pull to the parameter servers (module docstring)."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        *,
        ctx: Context,
        layout: Layout,
        mode: str,
        n_push: int = 1,
        n_fetch: int = 1,
        period: int = 1,
        elastic_alpha: float = 0.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        super().__init__(inner, params, world_size=ctx.world_size, period=1)
        members = ctx.membership
        assert members is not None
        self.ctx, self.layout, self.mode = ctx, layout, mode
        self.n_push, self.n_fetch, self.elastic_period = n_push, n_fetch, period
        self.elastic_alpha = elastic_alpha
        self.group = members.group
        self.shapes = [torch.Size(s) for s in layout.shapes]
        self.shard_ids = list(range(len(layout.plan)))
        self.channel = WorkerChannel(
            ctx.global_rank, layout.servers, layout.shard_numel(), layout.torch_dtype
        )
        self.reference = [p.detach().clone() for p in self.params]
        self.min_clock = 0
        self.pushed_at = 0  # local step of the latest push
        self._bytes_seen = 0
        self._closed = False
        ctx.on_data_end(self.finish)
        ctx.on_close(self.close)

    # ------------------------------------------------------------ communication

    def _timed(self, action: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        result = action()
        moved = self.channel.bytes_sent + self.channel.bytes_received
        self.meter.add(moved - self._bytes_seen, time.perf_counter() - start)
        self._bytes_seen = moved
        return result

    def _push(
        self, tensors: Sequence[torch.Tensor], *, pull: bool = False
    ) -> list[torch.Tensor] | None:
        """Push ``tensors``; with ``pull`` read the parameters back in the same
        messages (the read follows this very update: see ``WorkerChannel.push``)."""
        grads = {s: pack(tensors, self.layout.plan[s]) for s in self.shard_ids}
        pulled = self._timed(lambda: self.channel.push(grads, self.local_steps, pull=pull))
        self.pushed_at = self.local_steps
        return self._unpacked(pulled) if pull else None

    def _pull(self) -> list[torch.Tensor]:
        pulled = self._timed(lambda: self.channel.pull(self.shard_ids, clock=self.local_steps))
        return self._unpacked(pulled)

    def _unpacked(self, pulled: Mapping[int, Pulled]) -> list[torch.Tensor]:
        self.min_clock = min(p.min_clock for p in pulled.values())
        return unpack([pulled[s].flat for s in self.shard_ids], self.layout.plan, self.shapes)

    def _delta(self) -> list[torch.Tensor]:
        return [p.detach() - r for p, r in zip(self.params, self.reference, strict=True)]

    def _adopt(self, pulled: Sequence[torch.Tensor], keep_local: bool) -> None:
        """Parameters ← pulled (+ the local change not pushed yet); reference ← pulled."""
        with torch.no_grad():
            for p, r, fresh in zip(self.params, self.reference, pulled, strict=True):
                if keep_local:
                    p.add_(fresh - r)  # p = fresh + (p - r)
                else:
                    p.copy_(fresh)
                r.copy_(fresh)

    # ------------------------------------------------------------ the step

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        loss: Any = None
        if self.mode == "gradient":
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            grads = [self._dense_grad(p) for p in self.params]
            self.local_steps += 1
            self.meter.step()
            fresh = self._push(grads, pull=self.local_steps % self.n_fetch == 0)
            if fresh is not None:
                self._adopt(fresh, keep_local=False)
            return loss
        loss = self.inner.step(closure) if closure is not None else self.inner.step()
        self.local_steps += 1
        self.meter.step()
        if self.mode == "delta":
            fetch = self.local_steps % self.n_fetch == 0
            fresh = None
            if self.local_steps % self.n_push == 0:
                fresh = self._push(self._delta(), pull=fetch)
                with torch.no_grad():
                    for p, r in zip(self.params, self.reference, strict=True):
                        r.copy_(p)
            if fetch:
                self._adopt(fresh if fresh is not None else self._pull(), keep_local=True)
        elif self.local_steps % self.elastic_period == 0:
            self._elastic()
        return loss

    def _elastic(self) -> None:
        center = self._pull()
        with torch.no_grad():
            diff = [
                self.elastic_alpha * (p.detach() - c)
                for p, c in zip(self.params, center, strict=True)
            ]
            for p, d in zip(self.params, diff, strict=True):
                p.sub_(d)
        self._push(diff)

    def _dense_grad(self, p: torch.nn.Parameter) -> torch.Tensor:
        if p.grad is None:
            return torch.zeros_like(p)
        if p.grad.is_sparse:
            raise RuntimeError(
                "parameter-server strategies push dense tensors; use hogwild or a dense "
                "gradient (e.g. nn.Embedding(sparse=False)) for this parameter"
            )
        return p.grad.detach()

    # ------------------------------------------------------------ end, checkpoints

    def finish(self) -> None:
        """End of the data: push what is left (delta mode), say DONE, wait for the
        other workers, pull the final parameters (module docstring)."""
        if self.mode == "delta" and self.pushed_at < self.local_steps:
            self._push(self._delta())
        self.channel.done(clock=self.local_steps)
        dist.barrier(group=self.group)
        self._adopt(self._pull(), keep_local=False)

    def close(self) -> None:
        """Tell the servers this worker is gone (once)."""
        if not self._closed:
            self._closed = True
            self.channel.close(clock=self.local_steps)

    def strategy_state(self) -> dict[str, Any]:
        """The reference copy; on the first worker also every server's state."""
        state: dict[str, Any] = {
            "reference": [r.clone() for r in self.reference],
            "pushed_at": self.pushed_at,
        }
        if self.ctx.rank == 0:
            blobs = [self.channel.snapshot(server) for server in self.layout.servers]
            state["servers"] = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
        return state

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        """Restore the servers (first worker), then every worker continues from the
        servers' parameters (collective over the workers)."""
        servers = state.get("servers")
        if self.ctx.rank == 0 and servers is not None:
            if len(servers) != len(self.layout.servers):
                raise RuntimeError(
                    f"the checkpoint holds {len(servers)} server state(s); this run has "
                    f"{len(self.layout.servers)} parameter server(s)"
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
