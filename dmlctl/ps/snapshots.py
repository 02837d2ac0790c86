"""A parameter server's snapshots on disk, for its replacement in place (runtime
side, torch).

With ``restart.mode: in_place`` a server killed by SIGKILL is forked again by its
torchrun like a worker (:mod:`dmlctl.agent.respawn`). Its state — parameters,
versions, clocks, the rule's state, the pushes applied per worker — is written to
``rank-<R>.attempt-<A>.snapshot`` in its rank directory as it starts and every
``restart.ps_snapshot_every`` pushes (``torch.save`` to a temporary file, then
``os.replace``: a kill mid-write leaves the previous one) and, when the run has a spare
host (``DMLCTL_PS_SNAPSHOT_COPY``), a copy into the run's store (the memory of rank
0's host, in pieces: :mod:`dmlctl.runtime.store_blobs`), where a replacement started
on another host — its own lost with it — reads it; a copy the store refuses is
given up, said once, and the file goes on alone. The replacement starts from the
newest; the pushes applied since are lost, and each worker's HELLO says how many it
sent, so the server counts them (``pushes_lost``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

import torch

from dmlctl import private_files, protocol
from dmlctl.ps import frames
from dmlctl.runtime import rejoin, store_blobs


class Snapshots:
    """Server ``rank``'s snapshot file in ``rank_dir``, written every ``every``
    pushes."""

    def __init__(self, rank_dir: str, rank: int, every: int, *, copied: bool = False) -> None:
        attempt = os.environ.get(protocol.ENV_ATTEMPT, "1")
        self.path = protocol.rank_snapshot(rank_dir, rank, attempt)
        self.every = max(1, every)
        self._written_at: int | None = None
        #: Whether a newer process of this rank took over (its copies are the newer).
        self.superseded: Callable[[], bool] = lambda: False
        #: The store key of the copy (``copied``: the run's store is there), else None.
        self.key = rejoin.key(f"ps-snapshot/{rank}") if copied else None

    @classmethod
    def of_this_rank(cls, rank: int) -> Snapshots:
        """This server process's snapshots (its rank directory and interval from the
        environment dmlctl gives it; the current directory without one)."""
        rank_dir = os.environ.get(protocol.ENV_RANK_DIR) or os.getcwd()
        every = int(os.environ.get(protocol.ENV_PS_SNAPSHOT_EVERY) or "500")
        copied = rejoin.has_store() and os.environ.get(protocol.ENV_PS_SNAPSHOT_COPY) == "1"
        snapshots = cls(rank_dir, rank, every, copied=copied)
        snapshots.superseded = lambda: frames.endpoint(rank).superseded()
        return snapshots

    def due(self, pushes: int) -> bool:
        """Whether a snapshot is due after ``pushes`` pushes in all."""
        return self._written_at is None or pushes - self._written_at >= self.every

    def write(self, state: dict[str, Any], pushes: int) -> None:
        """Replace the snapshot with ``state`` (taken after ``pushes`` pushes, kept
        in it as ``total_pushes``)."""
        buffer = io.BytesIO()
        torch.save({**state, "total_pushes": pushes}, buffer)
        data = buffer.getvalue()
        tmp = f"{self.path}.tmp"
        with open(tmp, "wb", opener=private_files.private_opener) as f:
            f.write(data)
        os.replace(tmp, self.path)
        if self.key is not None and self.superseded():
            self.key = None  # a replacement's copies are the newer ones
            rejoin.say("this server was replaced meanwhile: no more snapshot copies from it")
        if self.key is not None:
            try:
                store_blobs.put(rejoin.store(), self.key, data)
            except RuntimeError as exc:
                self.key = None
                rejoin.say(
                    f"server snapshot copies to the run's store given up ({exc}); a "
                    "replacement on another host cannot start from one"
                )
        self._written_at = pushes

    def read(self) -> dict[str, Any]:
        """The newest snapshot: the file, else (a replacement on another host) the
        store's copy; raises RuntimeError naming both when neither can be read."""
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, ValueError) as exc:
            state = self._copy(f"no usable server snapshot at {self.path}: {exc}")
        if not isinstance(state, dict):
            raise RuntimeError(f"{self.path} holds a {type(state).__name__}, not a state")
        self._written_at = int(state.get("total_pushes", 0))
        return state

    def _copy(self, why: str) -> Any:
        """The store's copy (raises RuntimeError saying ``why`` and why not)."""
        data = store_blobs.get(rejoin.store(), self.key) if self.key is not None else None
        if data is None:
            raise RuntimeError(f"{why}, and none in the run's store")
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except (RuntimeError, ValueError) as exc:
            raise RuntimeError(f"{why}, and the run's store's copy is not one: {exc}") from exc
