"""A server rank's life: receive the layout, serve, report (runtime side, torch).

:func:`run_server` is what a parameter-server strategy's ``serve`` does on a server
rank: take part in the two bootstrap broadcasts (:mod:`dmlctl.ps.bootstrap`), build a
:class:`~dmlctl.ps.server.ParameterServer` for its shard with the layout's update
rule, and handle messages until every worker closed. Every ``log_every_s`` seconds
(and once at the end) it logs, as this rank's metrics:

* ``push_per_s``, ``pull_per_s``, ``push_bytes_per_s``, ``pull_bytes_per_s``;
* ``staleness_median`` / ``staleness_max`` of the updates applied in the window;
  a server holding several shards (DistBelief's parts) also logs each shard's
  largest staleness so far, ``staleness_max_shard_<k>``;
* ``clock_min`` / ``clock_max`` over the workers, ``clock_spread`` (their difference:
  for ``ssp`` the spread between the fastest and the slowest worker) and
  ``max_lead`` (the largest ``clock − min_clock`` of any answered read so far: never
  above the bound ``s`` under ``ssp``);
* ``version``: updates applied to the shard; for AdaDelay also ``step_size`` (the
  mean α of the latest update);
* for the servers that apply updates in rounds (:mod:`dmlctl.ps.rounds`): ``rounds``,
  and ``dropped`` (late gradients, ``sync-ps``) or ``delay_max`` / ``delay_now``
  (updates of z a worker missed, ``aadmm``).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel

from dmlctl.ps.bootstrap import LAYOUT_KEY, Layout, share_initial, share_layout
from dmlctl.ps.channel import ServerChannel
from dmlctl.ps.codec import PushCodec
from dmlctl.ps.frames import closed_key
from dmlctl.ps.rounds import BackupRounds, ConsensusRounds, RoundRule, RoundServer
from dmlctl.ps.rules import AdaDelay, ScaledAdd, UpdateRule
from dmlctl.ps.server import ParameterServer
from dmlctl.ps.snapshots import Snapshots
from dmlctl.runtime import rejoin

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


def make_rule(spec: Mapping[str, Any]) -> UpdateRule:
    """The rule ``spec`` names: ``{"kind": "scaled_add", "alpha": a}`` or
    ``{"kind": "adadelay", "L": L, "c": c}``; ValueError otherwise."""
    kind = spec.get("kind")
    if kind == "scaled_add":
        return ScaledAdd(float(spec["alpha"]))
    if kind == "adadelay":
        return AdaDelay(float(spec["L"]), float(spec.get("c", 1.0)))
    raise ValueError(f"unknown server update rule {kind!r}")


ROUND_RULES = ("backup", "consensus")
"""Rule kinds a :class:`~dmlctl.ps.rounds.RoundServer` applies."""


def make_round_rule(spec: Mapping[str, Any], workers: list[int]) -> RoundRule:
    """The round rule ``spec`` names: ``{"kind": "backup", "backup": b, "optimizer":
    name, "settings": {...}}`` or ``{"kind": "consensus", "min_workers": K₀,
    "max_delay": τ}``, for the global ranks ``workers``; ValueError otherwise."""
    kind = spec.get("kind")
    if kind == "backup":
        return BackupRounds(
            len(workers), int(spec["backup"]), str(spec["optimizer"]), dict(spec["settings"])
        )
    if kind == "consensus":
        return ConsensusRounds(workers, int(spec["min_workers"]), int(spec["max_delay"]))
    raise ValueError(f"unknown server round rule {kind!r}")


def server_metrics(server: ParameterServer) -> dict[str, float]:
    """The metrics of the module docstring for the window since the last call."""
    clocks = list(server.clocks.values())
    out: dict[str, float] = dict(server.stats.window())
    out.update(
        clock_min=float(min(clocks)),
        clock_max=float(max(clocks)),
        clock_spread=float(max(clocks) - min(clocks)),
        max_lead=float(server.max_lead),
        version=float(sum(server.versions.values())),
    )
    if len(server.shard_staleness_max) > 1:  # several shards here: each one's own maximum
        out.update(
            {f"staleness_max_shard_{k}": float(v) for k, v in server.shard_staleness_max.items()}
        )
    if isinstance(server.rule, AdaDelay) and server.rule.last_step:
        out["step_size"] = sum(server.rule.last_step.values()) / len(server.rule.last_step)
    if isinstance(server, RoundServer):
        out.update(server.rounds_rule.metrics())
    if server.elastic:  # restart.mode: in_place: workers lost, and waited for now
        out.update(workers_away=float(len(server.away)), departures=float(server.departures))
        out["pushes_lost"] = float(server.pushes_lost)
    return out


def serve(ctx: Context, params: BaseModel) -> None:
    """A parameter-server strategy's ``serve``: this server rank's whole life (the
    update rule comes in the workers' layout, so ``params`` are not needed)."""
    del params
    run_server(ctx)


def run_server(ctx: Context) -> ParameterServer:
    """Serve this rank's shard until every worker closed; returns the server (its
    final state) after logging the last window. A server that can be replaced in
    place (:mod:`dmlctl.ps.snapshots`) writes its snapshots as it goes; its
    replacement starts from the newest."""
    members = ctx.membership
    if members is None:
        raise RuntimeError("run_server needs a run with parameter servers")
    snapshots = Snapshots.of_this_rank(ctx.global_rank) if rejoin.servers_replaced() else None
    state: dict[str, Any] | None = None
    if snapshots is not None and rejoin.rejoining():
        layout: Layout = rejoin.read_object(LAYOUT_KEY)
        state = snapshots.read()
        mine = {int(k): t.reshape(-1).clone() for k, t in state["params"].items()}
    else:
        layout = share_layout(None, src=members.workers[0])
        mine = _initial_shards(ctx, layout, members.workers[0])
    server = _make_server(ctx, layout, mine)
    if rejoin.in_place():
        server.gone_after = rejoin.rejoin_wait()
        server.on_gone = functools.partial(_say_gone, tuple(server.workers))
    if state is not None:
        _restore(server, state, ctx.global_rank)
    last = time.monotonic()

    def report() -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= layout.log_every_s:
            ctx.log(step=server.stats.total_pushes, **server_metrics(server))
            last = now
        if snapshots is not None and snapshots.due(server.stats.total_pushes):
            snapshots.write(server.state_dict(), server.stats.total_pushes)

    report()  # the first snapshot, before any push
    server.serve(on_message=report)
    ctx.log(step=server.stats.total_pushes, **server_metrics(server))
    return server


def _initial_shards(ctx: Context, layout: Layout, src: int) -> dict[int, torch.Tensor]:
    """This server's shards as the first worker's model has them (the bootstrap's
    collectives)."""
    if layout.parts:  # DistBelief: each part's values come from its first worker
        from dmlctl.ps.parts import share_initial_parts  # imports DTensor

        starts = share_initial_parts(layout, None, ctx.global_rank)
    else:
        starts = dict(enumerate(share_initial(layout, src=src)))
    return {k: starts[k] for k in range(len(layout.plan)) if layout.server_of(k) == ctx.global_rank}


def _make_server(ctx: Context, layout: Layout, mine: dict[int, torch.Tensor]) -> ParameterServer:
    """The server of ``layout``'s rule over the shards ``mine``."""
    codec = PushCodec(layout.push, layout.shard_sizes()) if layout.push else None
    numel = {k: t.numel() for k, t in mine.items()}
    channel = ServerChannel(ctx.global_rank, numel, layout.torch_dtype, codec)
    if layout.rule.get("kind") in ROUND_RULES:
        rule = make_round_rule(layout.rule, layout.workers)
        return RoundServer(mine, layout.workers, channel, rule=rule, elastic=rejoin.in_place())
    return ParameterServer(
        mine,
        layout.workers,
        channel,
        rule=make_rule(layout.rule),
        staleness_bound=layout.staleness_bound,
        elastic=rejoin.in_place(),
    )


def _say_gone(workers: tuple[int, ...], worker: int, gone: bool) -> None:
    """Worker rank ``worker`` (one of ``workers``, global ranks in order) is gone from
    the run (``gone``: away past ``restart.rejoin_wait``), or back: said in the run's
    store, where the workers' store collectives (by worker index) and torchrun's exit
    wait (by rank) look (:class:`dmlctl.runtime.rejoin.StoreGroup`)."""
    store, index = rejoin.store(), workers.index(worker)
    if gone:
        store.set(rejoin.gone_key(index), "1")
        store.set(rejoin.done_key(worker), "1")  # torchruns stop waiting for it
        rejoin.say(f"worker rank {worker} is gone: the servers go on without it")
    else:
        store.delete_key(rejoin.gone_key(index))
        store.delete_key(rejoin.done_key(worker))
        rejoin.say(f"worker rank {worker} is back")


def _restore(server: ParameterServer, state: dict[str, Any], rank: int) -> None:
    """A replacement server (global rank ``rank``): its predecessor's snapshot, its
    push count, the workers that closed before it started (they said so in the run's
    store, with the pushes they sent it: those after the snapshot are lost) and those
    gone (:func:`_say_gone`); each other worker is gone too if it does not connect
    within ``gone_after`` (it may have been lost while this server's predecessor was)."""
    server.load_state_dict(state)
    server.stats.total_pushes = int(state.get("total_pushes", 0))
    store, now = rejoin.store(), time.monotonic()
    for index, worker in enumerate(server.workers):
        if store.check([closed_key(worker)]):
            server.closed.add(worker)
            server.finished.add(worker)
            sent = json.loads(store.get(closed_key(worker)))
            server.sent_by(worker, int(sent.get(str(rank), 0)) if isinstance(sent, dict) else 0)
        elif store.check([rejoin.gone_key(index)]):
            server.gone.add(worker)
            server.closed.add(worker)
            server.finished.add(worker)
        else:
            server.away_since[worker] = now  # until its HELLO
