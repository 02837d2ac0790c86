"""A worker started again in place joins the running world (``restart.mode: in_place``).

With ``restart.mode: in_place`` a parameter-server worker killed by SIGKILL is forked
again by its torchrun (:mod:`dmlctl.agent.respawn`) while every other rank goes on;
the new process has ``DMLCTL_REJOIN`` set. It cannot call ``init_process_group`` (the
world has met), so it takes what the collectives of a first start would have given it
from elsewhere:

* **the run's store**: every rank of such a run reaches torchrun's store
  (``MASTER_ADDR:MASTER_PORT``) through a client of its own under dmlctl's prefix
  (:func:`store`), so a replacement reads the keys the others wrote; the
  parameter-server channel finds the servers there. Every value is signed with the
  run key and checked as it is read (:mod:`dmlctl.runtime.signed_store`);
* **the roles**: every rank's role, which the first rank wrote to the store when the
  world met (:func:`publish_membership`, :func:`read_membership`); its workers' group
  is none: a replacement takes part in no collective;
* **the model**: the layout the first worker wrote (:func:`publish_object`) and the
  servers' current parameters (:mod:`dmlctl.ps.bootstrap`);
* **the workers' collectives**: in such a run ``ctx.barrier`` and
  ``ctx.all_reduce_mean`` go through the store (:class:`StoreGroup`), numbered per
  worker, so a replacement takes part in them where its predecessor stopped;
* **its data position**: every worker of such a run writes its position in its data
  (epoch, batches yielded) to ``rank-<R>.attempt-<A>.position`` in its rank directory
  as it takes each batch (:class:`Position`); the replacement's ``ctx.shard`` starts
  there, so it goes on with the batches its predecessor had not taken (the one in
  flight when it died is lost with its update). A worker whose context closed leaves
  a ``.finished`` mark beside it: its death after that is not replaced.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import time
import zlib
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from dmlctl import private_files, protocol
from dmlctl.runtime.signed_store import ForgedValue, SignedStore

_KEY = "dmlctl/rejoin"
_STORE_TIMEOUT = timedelta(seconds=300)
GONE_POLL = timedelta(seconds=1)
"""How often a store collective looks whether a worker it waits for left the run."""
MIRROR_S = 1.0
"""How often a worker's data position is copied to the run's store."""
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
"""How long a worker waits in a store collective for the others (the default
process group's timeout)."""
_store: tuple[tuple[str | None, str | None], SignedStore] | None = None
STORE_PREFIX = "dmlctl"  # the ranks' keys in torchrun's store (MASTER_ADDR:MASTER_PORT)


def connect(addr: str, port: int, timeout: timedelta = _STORE_TIMEOUT) -> Store:
    """A new client of the run's store at ``addr:port`` (torchrun's), under dmlctl's
    prefix: the keys every process of the run reads and writes."""
    return PrefixStore(STORE_PREFIX, TCPStore(addr, port, is_master=False, timeout=timeout))


def done_key(rank: int) -> str:
    """The key that rank ``rank`` of an in-place run sets once it is done with the
    store, as its process ends (:func:`done`)."""
    return f"done/{rank}"


def in_place() -> bool:
    """Whether this run replaces lost workers in place."""
    return protocol.in_place(os.environ)


def servers_replaced() -> bool:
    """Whether this run's lost parameter servers are replaced in place too, from
    their snapshots (``DMLCTL_RESPAWN_SERVERS``)."""
    return in_place() and os.environ.get(protocol.ENV_RESPAWN_SERVERS) == "1"


def rejoining() -> bool:
    """Whether this process replaces a lost worker (``DMLCTL_REJOIN`` set)."""
    return bool(os.environ.get(protocol.ENV_REJOIN))


def store() -> SignedStore:
    """The run's store, its values signed and checked (:mod:`~dmlctl.runtime.signed_store`):
    the default group's in a process that met the world, unless the run replaces
    workers in place; then (and in a replacement, which has no group) a client of
    torchrun's store (``MASTER_ADDR:MASTER_PORT``) under dmlctl's own prefix, made once
    per endpoint, so that every process of the run reads the same keys."""
    global _store
    endpoint = (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))
    shared = in_place() or not dist.is_initialized()
    if not shared or endpoint[0] is None or endpoint[1] is None:
        return SignedStore(dist.distributed_c10d._get_default_store())
    if _store is None or _store[0] != endpoint:
        _store = (endpoint, SignedStore(connect(endpoint[0], int(endpoint[1]))))
    return _store[1]


def done() -> None:
    """Say in the store that this rank is done with it (its process ends): each
    torchrun of an in-place run waits for that of every rank before it ends
    (:func:`dmlctl.agent.elastic_agent.wait_for_ranks`)."""
    store().set(done_key(int(os.environ.get("RANK", "0"))), "1")


def rejoin_wait() -> float:
    """Seconds the others wait for a lost worker's replacement before they go on
    without it (``restart.rejoin_wait``); infinity: they wait for it."""
    try:
        wait = float(os.environ.get(protocol.ENV_REJOIN_WAIT, "0"))
    except ValueError:
        return math.inf
    return wait if wait > 0 else math.inf


def gone_key(index: int) -> str:
    """The store key that says the worker of index ``index`` (among the workers: its
    rank where no rank is a server) left the run: the others went on without it
    (:mod:`dmlctl.strategies.members`, :mod:`dmlctl.ps.serve`)."""
    return key(f"elastic/gone/{index}")


def say(message: str) -> None:
    """Print ``message`` on this rank's stdout as dmlctl's (the dashboard's log
    pane and ``dmlctl logs`` show it)."""
    print(f"dmlctl: {message}", flush=True)


def key(name: str) -> str:
    """The store key ``name`` of this run's attempt."""
    return f"{_KEY}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{name}"


def publish_membership(workers: tuple[int, ...], servers: tuple[int, ...]) -> None:
    """Write every rank's role to the store (the first rank, when the world meets)."""
    store().set(key("membership"), json.dumps({"workers": workers, "servers": servers}))


def read_membership() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The workers' and the servers' global ranks, as :func:`publish_membership` wrote
    (:class:`ForgedValue` for roles another process wrote)."""
    data = json.loads(store().get(key("membership")))
    return tuple(data["workers"]), tuple(data["servers"])


def publish_object(name: str, value: Any) -> None:
    """Keep ``value`` (picklable) in the store under ``name`` for a replacement."""
    store().set(key(name), pickle.dumps(value).hex())


def read_object(name: str) -> Any:
    """What :func:`publish_object` kept under ``name`` (waits until it is there). A
    value not signed with the run key is never unpickled: :class:`ForgedValue`."""
    return pickle.loads(bytes.fromhex(store().get(key(name)).decode()))


class Position:
    """A worker's position in its data, kept in its rank directory as it goes
    (:func:`dmlctl.protocol.rank_position`): one small write per batch, read back by
    its replacement."""

    def __init__(self, rank_dir: str, rank: int) -> None:
        attempt = os.environ.get(protocol.ENV_ATTEMPT, "1")
        self.path = protocol.rank_position(rank_dir, rank, attempt)
        self._finished = protocol.rank_finished(rank_dir, rank, attempt)
        self._trained = protocol.rank_trained(rank_dir, rank, attempt)
        self._rank, self._key = rank, _position_key(rank)
        self._fd: int | None = None
        #: Copied to the store (which every rank of such a run reaches through
        #: ``MASTER_ADDR:MASTER_PORT``; a process without them has none to copy to).
        self._mirror_at = 0.0 if has_store() else math.inf

    def write(self, epoch: int, batches: int, taken: int) -> None:
        """Record that ``batches`` of ``epoch`` have been taken, ``taken`` in all: in
        the file at once, in the run's store at most every :data:`MIRROR_S` seconds
        (for a replacement on another host, when this one is lost)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        text = f"{epoch:>12} {batches:>12} {taken:>14}\n"
        os.pwrite(self._fd, text.encode(), 0)
        now = time.monotonic()
        if now >= self._mirror_at:
            self._mirror_at = now + MIRROR_S
            store().set(self._key, text)

    def finish(self) -> None:
        """Mark this worker's part of the attempt over: a death after it is not
        replaced (the servers expect nothing more of it). Said in the run's store too,
        for a replacement on another host (:func:`finished_key`)."""
        _touch(self._finished)
        if has_store():
            with contextlib.suppress(Exception):  # best effort: the run is ending
                store().set(finished_key(self._rank), "1")

    def trained(self, over: bool) -> None:
        """Mark this worker's training ``over`` (its last round with its peers done: a
        death after it is not replaced, its peers being past every round it could
        rejoin), or not any more (it trains again)."""
        if over:
            _touch(self._trained)
        elif os.path.exists(self._trained):
            os.unlink(self._trained)

    def read(self) -> tuple[int, int, int] | None:
        """The last position written: (epoch, batches of it, batches in all), from the
        file on this host or, further on, the store's copy (the predecessor ran on a
        host now lost: up to :data:`MIRROR_S` seconds of its batches are taken again);
        None when none was."""
        found = [_parse(lambda: Path(self.path).read_text(encoding="ascii"))]
        if self._mirror_at < math.inf:
            found.append(mirrored_position(self._rank))
        known = [at for at in found if at is not None]
        return max(known, key=lambda at: at[2]) if known else None


def mirrored_position(rank: int) -> tuple[int, int, int] | None:
    """Worker ``rank``'s position as it last copied it to the run's store (at most
    :data:`MIRROR_S` seconds old; None: none yet)."""
    name = _position_key(rank)
    return _parse(lambda: store().get(name).decode()) if store().check([name]) else None


def finished_key(rank: int) -> str:
    """The store key that says worker ``rank``'s part of the attempt was over (its
    script had ended: :meth:`Position.finish`)."""
    return key(f"finished/{rank}")


def _position_key(rank: int) -> str:
    return key(f"position/{rank}")


def has_store() -> bool:
    """Whether this process knows the run's store (torchrun gave it
    ``MASTER_ADDR``/``MASTER_PORT``)."""
    return "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ


def _parse(read: Callable[[], str]) -> tuple[int, int, int] | None:
    """A position as :meth:`Position.write` wrote it (None: none, or unreadable)."""
    try:
        epoch, batches, taken = read().split()
        return int(epoch), int(batches), int(taken)
    except (OSError, ValueError, ForgedValue):
        return None


def _touch(path: str) -> None:
    with open(path, "w", encoding="ascii", opener=private_files.private_opener):
        pass


def check_one_model(params: Iterable[torch.Tensor], group: StoreGroup) -> None:
    """After the data of a run that replaces workers in place: every worker's final
    parameters must be the same (a CRC-32 of their bytes, compared through the
    store), since the servers' model is what each one took. Raises RuntimeError
    naming the workers whose parameters differ from the first worker's."""
    digest = 0
    for p in params:
        digest = zlib.crc32(p.detach().cpu().contiguous().view(torch.uint8).numpy().data, digest)
    values = group.gather(float(digest))
    first = min(values)
    differ = [rank for rank, value in values.items() if value != values[first]]
    if differ:
        raise RuntimeError(
            "restart.mode: in_place: the workers' final parameters differ (worker "
            f"{', '.join(map(str, differ))} against worker {first}) although each took "
            "the servers' model: a replacement did not rejoin the same model"
        )


class StoreGroup:
    """The workers' barrier and scalar mean through the run's store, for a run that
    replaces lost workers in place: worker ``rank`` of ``world`` writes its value
    under the call's number and waits for every worker's, but a worker's that is gone
    from the run (:func:`gone_key`: the others went on without it). The number of
    calls done is kept in the store after each, so a replacement goes on from its
    predecessor's; the calls a replacement makes before its first batch
    (``joined()`` false) are its own alone (the others made them long ago) and
    return its value."""

    def __init__(self, rank: int, world: int, joined: Callable[[], bool]) -> None:
        self.rank, self.world, self._joined = rank, world, joined
        self._done = key(f"coll-done/{rank}")
        found = rejoining() and store().check([self._done])
        self.calls = int(store().get(self._done)) if found else 0

    def gather(self, value: float) -> dict[int, float]:
        """Every worker's ``value`` of this call (worker → value; the workers gone
        from the run left out: :func:`gone_key`). Blocks until all are in, at most
        :data:`COLLECTIVE_TIMEOUT`."""
        if rejoining() and not self._joined():
            return {self.rank: float(value)}
        s, n = store(), self.calls
        keys = {r: key(f"coll/{n}/{r}") for r in range(self.world)}
        s.set(keys[self.rank], repr(float(value)))
        present = self._wait(s, keys)
        values = {r: float(s.get(keys[r])) for r in present}
        if n > 0:  # every worker has read call n-1's values: it set its key of call n
            s.delete_key(key(f"coll/{n - 1}/{self.rank}"))
        self.calls = n + 1
        s.set(self._done, str(self.calls))
        return values

    def _wait(self, s: SignedStore, keys: dict[int, str]) -> list[int]:
        """The workers not gone, once each has set its key of ``keys`` (looked at in
        slices of :data:`GONE_POLL`: a worker may be found gone meanwhile)."""
        deadline = time.monotonic() + COLLECTIVE_TIMEOUT.total_seconds()
        while True:
            present = [r for r in keys if r == self.rank or not s.check([gone_key(r)])]
            try:
                s.wait([keys[r] for r in present], GONE_POLL)
                return present
            except RuntimeError:  # a slice's timeout
                if time.monotonic() >= deadline:
                    raise
