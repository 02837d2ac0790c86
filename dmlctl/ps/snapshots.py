"""A parameter server's snapshots on disk, for its replacement in place (runtime
side, torch).

With ``restart.mode: in_place`` a server killed by SIGKILL is forked again by its
torchrun like a worker (:mod:`dmlctl.agent.respawn`). Its state — parameters,
versions, clocks, the rule's state, the pushes applied per worker — is written to
``rank-<R>.attempt-<A>.snapshot`` in its rank directory as it starts and every
``restart.ps_snapshot_every`` pushes (``torch.save`` to a temporary file, then
``os.replace``: a kill mid-write leaves the previous one). The replacement starts
from the newest; the pushes applied since are lost, and each worker's HELLO says how
many it sent, so the server counts them (``pushes_lost``).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from dmlctl import protocol


class Snapshots:
    """Server ``rank``'s snapshot file in ``rank_dir``, written every ``every``
    pushes."""

    def __init__(self, rank_dir: str, rank: int, every: int) -> None:
        attempt = os.environ.get(protocol.ENV_ATTEMPT, "1")
        self.path = protocol.rank_snapshot(rank_dir, rank, attempt)
        self.every = max(1, every)
        self._written_at: int | None = None

    @classmethod
    def of_this_rank(cls, rank: int) -> Snapshots:
        """This server process's snapshots (its rank directory and interval from the
        environment dmlctl gives it; the current directory without one)."""
        rank_dir = os.environ.get(protocol.ENV_RANK_DIR) or os.getcwd()
        every = int(os.environ.get(protocol.ENV_PS_SNAPSHOT_EVERY) or "500")
        return cls(rank_dir, rank, every)

    def due(self, pushes: int) -> bool:
        """Whether a snapshot is due after ``pushes`` pushes in all."""
        return self._written_at is None or pushes - self._written_at >= self.every

    def write(self, state: dict[str, Any], pushes: int) -> None:
        """Replace the snapshot with ``state`` (taken after ``pushes`` pushes, kept
        in it as ``total_pushes``)."""
        tmp = f"{self.path}.tmp"
        torch.save({**state, "total_pushes": pushes}, tmp)
        os.replace(tmp, self.path)
        self._written_at = pushes

    def read(self) -> dict[str, Any]:
        """The newest snapshot; raises RuntimeError naming the file when there is none
        or it cannot be read."""
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, ValueError) as exc:
            raise RuntimeError(f"no usable server snapshot at {self.path}: {exc}") from exc
        if not isinstance(state, dict):
            raise RuntimeError(f"{self.path} holds a {type(state).__name__}, not a state")
        self._written_at = int(state.get("total_pushes", 0))
        return state
