"""The device mesh of a job's ``parallelism:`` block, as plain data (torch-free).

The control plane (validation, the dry run, the dashboard, ``status``) and the ranks
(``torch.distributed.device_mesh``) lay the workers out the same way, from this one
module. The dimensions follow torchtitan, outermost first::

    pp  ×  dp_replicate  ×  dp_shard  ×  tp

Worker ``r`` (its rank among the workers) has the row-major coordinates of ``r`` in
that shape: tensor-parallel peers are neighbours (``tp`` is innermost), pipeline
stages are the outermost blocks. Only the dimensions of size > 1 are in the mesh
(``dp_replicate`` stays when every dimension is 1). A group of a dimension is the
ranks that share every other coordinate.

Pipeline schedules run one stage per rank (``GPipe``, ``1F1B``) or several: the
looped ones (``Interleaved1F1B``, ``LoopedBFS``, ``InterleavedZeroBubble``) give pipeline
rank ``s`` the stages ``s, s + pp, …``; the V-shaped ones (``ZBVZeroBubble``,
``DualPipeV``) give it ``s`` and ``2·pp − 1 − s``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dmlctl.protocol import ROLE_WORKER

DIMS: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "tp")
"""The mesh's dimensions, outermost first."""
SHORT = {"pp": "pp", "dp_replicate": "dp", "dp_shard": "fsdp", "tp": "tp"}
"""How the dashboard names each dimension."""

SINGLE_STAGE = ("GPipe", "1F1B")
LOOPED = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
SCHEDULES: tuple[str, ...] = (*SINGLE_STAGE, *LOOPED, *V_SHAPED)
"""The pipeline schedules of ``torch.distributed.pipelining``, as it names them."""


def schedule_name(name: str) -> str | None:
    """``name`` as :data:`SCHEDULES` spells it (case-insensitive, as torch matches
    it), or None when it is not one."""
    return next((s for s in SCHEDULES if s.lower() == name.lower()), None)


def stages_per_rank(schedule: str) -> int:
    """Pipeline stages each pipeline rank holds under ``schedule``."""
    return 1 if schedule_name(schedule) in SINGLE_STAGE else 2


@dataclass(frozen=True)
class MeshLayout:
    """The degrees of each dimension (all resolved: no -1) and the pipeline schedule."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    schedule: str = "1F1B"
    microbatches: int = 0  # 0: none set (the runtime derives it)

    @property
    def sizes(self) -> dict[str, int]:
        """Every dimension's degree, outermost first."""
        return {d: int(getattr(self, d)) for d in DIMS}

    @property
    def world(self) -> int:
        """Workers the layout needs: the product of the degrees."""
        return math.prod(self.sizes.values())

    @property
    def names(self) -> tuple[str, ...]:
        """The mesh's dimensions: those of size > 1, else ``dp_replicate``."""
        names = tuple(d for d, n in self.sizes.items() if n > 1)
        return names or ("dp_replicate",)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[d] for d in self.names)

    @property
    def model_parallel(self) -> bool:
        """Whether a replica of the model spans several ranks (tensor or pipeline)."""
        return self.pp > 1 or self.tp > 1

    def coords(self, rank: int) -> dict[str, int]:
        """Worker ``rank``'s coordinate on every dimension (all four)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside a mesh of {self.world} workers")
        out: dict[str, int] = {}
        rest = rank
        for dim in reversed(DIMS):
            rest, out[dim] = divmod(rest, self.sizes[dim])
        return {d: out[d] for d in DIMS}

    def rank_of(self, coords: dict[str, int]) -> int:
        """Inverse of :meth:`coords` (missing dimensions count as 0)."""
        rank = 0
        for dim in DIMS:
            rank = rank * self.sizes[dim] + coords.get(dim, 0)
        return rank

    def groups(self, dim: str) -> list[list[int]]:
        """The groups of dimension ``dim``: each the ranks that differ only in it."""
        out: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world):
            c = self.coords(rank)
            key = tuple(v for d, v in c.items() if d != dim)
            out.setdefault(key, []).append(rank)
        return list(out.values())

    def stages(self, pp_rank: int) -> list[int]:
        """The pipeline stages pipeline rank ``pp_rank`` holds (0-based stage ids)."""
        if stages_per_rank(self.schedule) == 1:
            return [pp_rank]
        if schedule_name(self.schedule) in V_SHAPED:
            return [pp_rank, 2 * self.pp - 1 - pp_rank]
        return [pp_rank + i * self.pp for i in range(stages_per_rank(self.schedule))]

    @property
    def n_stages(self) -> int:
        return self.pp * stages_per_rank(self.schedule) if self.pp > 1 else 1

    def label(self, rank: int) -> str:
        """Worker ``rank``'s place, as the dashboard shows it: its coordinate on each
        dimension of the mesh and its pipeline stages (``pp1 tp0``, ``stages 1,3``)."""
        c = self.coords(rank)
        parts = [f"{SHORT[d]}{c[d]}" for d in self.names if self.sizes[d] > 1]
        if self.pp > 1 and stages_per_rank(self.schedule) > 1:
            parts.append("stages " + ",".join(map(str, self.stages(c["pp"]))))
        return " ".join(parts)

    def describe(self) -> list[str]:
        """The mesh for the dry run: its shape, then every dimension's groups."""
        shape = " × ".join(f"{d} {self.sizes[d]}" for d in self.names)
        lines = [f"device mesh: {shape} ({self.world} workers)"]
        for dim in self.names:
            if self.sizes[dim] > 1:
                groups = "  ".join("[" + ", ".join(map(str, g)) + "]" for g in self.groups(dim))
                lines.append(f"  {dim} groups: {groups}")
        if self.pp > 1:
            stages = "  ".join(
                f"pp{s}: " + ",".join(map(str, self.stages(s))) for s in range(self.pp)
            )
            mb = f", {self.microbatches} microbatches" if self.microbatches else ""
            lines.append(f"  pipeline: {self.schedule}, {self.n_stages} stages{mb} ({stages})")
        return lines


def dumps(layout: MeshLayout) -> str:
    """``layout`` as the JSON of ``DMLCTL_PARALLELISM`` (how the ranks get it)."""
    return json.dumps(dataclasses.asdict(layout), sort_keys=True)


def loads(text: str) -> MeshLayout:
    """Inverse of :func:`dumps`; raises ValueError on anything else."""
    try:
        data = json.loads(text)
        layout = MeshLayout(**data)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a mesh layout: {exc}") from None
    if any(n < 1 for n in layout.sizes.values()) or schedule_name(layout.schedule) is None:
        raise ValueError(f"not a mesh layout: {text}")
    return layout


def layout_from(data: Mapping[str, object]) -> MeshLayout:
    """A layout from its ``dataclasses.asdict`` form (how ``plan.json`` and
    ``state.json`` keep it); raises ValueError on anything else."""
    return loads(json.dumps(dict(data)))


def worker_ranks(ranks: Iterable[tuple[int, str]]) -> list[int]:
    """The global ranks of the workers among ``ranks`` (``(rank, role)`` pairs), in
    mesh order: the runtime lays the mesh over the workers in the order of their
    global ranks, so mesh worker ``i`` is global rank ``worker_ranks(...)[i]``
    (parameter servers take no place in the mesh)."""
    return sorted(rank for rank, role in ranks if role == ROLE_WORKER)


def describe_over(layout: MeshLayout, ranks: Sequence[int]) -> list[str]:
    """:meth:`MeshLayout.describe` with mesh worker ``i`` shown as ``ranks[i]`` in the
    groups (its global rank, :func:`worker_ranks`); the same lines when ``ranks`` is
    ``0..world-1``. Raises ValueError when ``ranks`` does not name ``layout.world``
    workers."""
    if len(ranks) != layout.world:
        raise ValueError(f"{len(ranks)} ranks for a mesh of {layout.world} workers")
    lines = layout.describe()
    groups = [
        f"  {dim} groups: "
        + "  ".join("[" + ", ".join(str(ranks[r]) for r in g) + "]" for g in layout.groups(dim))
        for dim in layout.names
        if layout.sizes[dim] > 1
    ]
    return [lines[0], *groups, *lines[1 + len(groups) :]]
