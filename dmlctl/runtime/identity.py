"""Who a rank is in the run (:class:`RankIdentity`): its place among the workers
(:class:`RankPlace`: index, count, data-parallel replica), its role, device, strategy
and layout, all fixed at ``init()``. The read-only part of
:class:`~dmlctl.runtime.context.Context`, which extends it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import BaseModel
from torch.distributed.device_mesh import DeviceMesh

from dmlctl.mesh import MeshLayout
from dmlctl.protocol import ROLE_SERVER
from dmlctl.runtime.env import RunEnv
from dmlctl.runtime.membership import Membership
from dmlctl.runtime.parallel.devmesh import data_parallel_place


@dataclass(frozen=True)
class RankPlace:
    """A rank's indices among the training processes; a server keeps its global ones."""

    rank: int
    world: int
    data_rank: int
    data_world: int
    is_server: bool


def place_of(env: RunEnv, membership: Membership | None, mesh: DeviceMesh | None) -> RankPlace:
    """This process's place: with parameter servers a worker counts among the workers
    only; under a ``parallelism:`` layout the ranks of one model replica (its pipeline
    stages and tensor-parallel peers, which see the same batches) share a data rank."""
    is_server = membership is not None and env.rank in membership.servers
    if membership is not None and not is_server:
        rank, world = membership.worker_index(env.rank), len(membership.workers)
    else:
        rank, world = env.rank, env.world_size
    data_rank, data_world = rank, world
    if env.layout is not None and mesh is not None and not is_server:
        data_rank, data_world = data_parallel_place(env.layout, rank)
    return RankPlace(rank, world, data_rank, data_world, is_server)


class RankIdentity:
    """The rank's identity (see the module docstring); every attribute read-only."""

    def __init__(
        self,
        env: RunEnv,
        *,
        device: torch.device,
        membership: Membership | None,
        mesh: DeviceMesh | None,
    ) -> None:
        self._env, self._device, self._members, self._mesh = env, device, membership, mesh
        self._at = place_of(env, membership, mesh)

    @property
    def rank(self) -> int:
        """This worker's rank among the training processes, ``0 .. world_size - 1``
        (the global rank, except with parameter servers: then the index among the
        workers)."""
        return self._at.rank

    @property
    def world_size(self) -> int:
        """Number of training processes (workers; parameter servers not counted)."""
        return self._at.world

    @property
    def global_rank(self) -> int:
        """Rank in the default process group (servers included)."""
        return self._env.rank

    @property
    def membership(self) -> Membership | None:
        """Global ranks of workers and servers and the workers' group (None: no
        parameter servers in this run)."""
        return self._members

    @property
    def data_parallel_rank(self) -> int:
        """This worker's replica among the data-parallel replicas: :attr:`rank`, except
        under tensor or pipeline parallelism, where the ranks of one replica (which
        must see the same batches) share it. Shard data by it, not by :attr:`rank`."""
        return self._at.data_rank

    @property
    def data_parallel_size(self) -> int:
        """Number of data-parallel replicas: :attr:`world_size` divided by the
        tensor and pipeline degrees."""
        return self._at.data_world

    @property
    def layout(self) -> MeshLayout | None:
        """The job's ``parallelism:`` layout (None without one)."""
        return self._env.layout

    @property
    def parallelize_function(self) -> str | None:
        """The job's ``parallelize: FILE:FUNCTION`` (None without one)."""
        return self._env.parallelize

    @property
    def mesh(self) -> DeviceMesh | None:
        """The device mesh over the workers (None without a ``parallelism:`` block or
        in a world of 1); ``ctx.mesh["tp"]`` is this worker's tensor-parallel group."""
        return self._mesh

    @property
    def local_rank(self) -> int:
        """Rank among the processes on this host."""
        return self._env.local_rank

    @property
    def local_world_size(self) -> int:
        """Number of processes on this host."""
        return self._env.local_world_size

    @property
    def role(self) -> str:
        """``worker`` for training processes; strategies may define others (``server``)."""
        return self._env.role

    @property
    def device(self) -> torch.device:
        """Where this rank's model and batches live."""
        return self._device

    @property
    def strategy(self) -> str:
        """Registered name of the strategy in use."""
        return self._env.strategy

    @property
    def fsdp(self) -> bool:
        """Whether the strategy's data-parallel dimensions are FSDP2 shards (its
        capabilities say so: ssgd)."""
        return self._env.capabilities.fsdp

    @property
    def strategy_params(self) -> BaseModel:
        """The validated parameters of the strategy (its ``Params`` instance)."""
        return self._env.params

    @property
    def is_main(self) -> bool:
        """True on rank 0: the rank that prints, evaluates once, saves checkpoints."""
        return self._at.rank == 0 and self.role != ROLE_SERVER

    def _tensor_degree(self) -> int:
        """The job's tensor-parallel degree (1 without a ``parallelism:`` block)."""
        layout = self._env.layout
        return 1 if layout is None else layout.tp

    def _laid_out(self) -> bool:
        """Whether the job has a ``parallelism:`` block and this rank is on its mesh."""
        return self._env.layout is not None and self._mesh is not None
