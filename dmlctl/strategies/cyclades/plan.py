"""Cyclades' planner (Pan, Lam, Tu, Papailiopoulos, Zhang, Jordan, Ramchandran & Ré,
"Cyclades: Conflict-free Asynchronous Machine Learning", NeurIPS 2016). Torch-free.

A round samples ``B`` updates (samples); update ``i`` reads and writes the coordinates
``coords[i]``. Two updates **conflict** when they share a coordinate; the connected
components of that conflict graph are computed with union–find
(:func:`components`), and whole components are given to the workers, largest first,
each to the least-loaded worker (:func:`assign`, greedy LPT: no worker's load exceeds
the average plus the largest component). Within a worker the components keep the
order of their first update and each component its updates' sampled order. Updates
of different workers then touch disjoint coordinates, so running the workers' lists
concurrently, without locks, gives exactly the result of running them one after the
other (serializability).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def components(coords: Sequence[Iterable[int]]) -> list[list[int]]:
    """The connected components of the conflict graph of updates ``0 .. len(coords)−1``
    (updates sharing a coordinate are connected): each a list of update positions in
    increasing order, the components ordered by their first position. An update that
    touches no coordinate is a component of its own."""
    parent = list(range(len(coords)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}  # coordinate → an update that touches it
    for i, cs in enumerate(coords):
        for c in cs:
            j = owner.setdefault(c, i)
            if j != i:
                a, b = root(i), root(j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(len(coords)):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def assign(parts: Sequence[Sequence[int]], workers: int) -> list[list[list[int]]]:
    """Whole components to ``workers`` workers, balanced by size: largest first (ties:
    the earlier component), each onto the least-loaded worker (ties: the lower rank).
    Returns, per worker, its components ordered by their first update. Raises
    ValueError for fewer than one worker."""
    if workers < 1:
        raise ValueError(f"need at least 1 worker, got {workers}")
    loads = [0] * workers
    mine: list[list[list[int]]] = [[] for _ in range(workers)]
    order = sorted(range(len(parts)), key=lambda k: (-len(parts[k]), k))
    for k in order:
        w = min(range(workers), key=lambda r: (loads[r], r))
        mine[w].append(list(parts[k]))
        loads[w] += len(parts[k])
    for lists in mine:
        lists.sort(key=lambda g: g[0] if g else -1)
    return mine


def plan_round(coords: Sequence[Iterable[int]], workers: int) -> list[list[list[int]]]:
    """:func:`assign` of the :func:`components` of one round's updates."""
    return assign(components(coords), workers)
