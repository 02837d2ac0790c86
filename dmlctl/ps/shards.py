"""Size-balanced assignment of parameter tensors to parameter servers (pure, torch-free).

:func:`plan_shards` works on tensor *sizes* (element counts), so the control plane
can plan without torch. Shard ``k`` of a plan is the list of tensor indices server
``k`` holds, in increasing index order.
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_shards(sizes: Sequence[int], n_servers: int) -> list[list[int]]:
    """Assign tensors (by index into ``sizes``) to ``n_servers`` servers.

    Greedy largest-first: tensors in decreasing size (ties: lower index first) each go
    to the currently least-loaded server (ties: lower server index), so the result is
    deterministic.

    Promises:

    * the result has exactly ``n_servers`` lists; every index ``0 … len(sizes)-1``
      appears in exactly one of them; each list is sorted;
    * with ``load(k) = Σ sizes[i] for i in shard k``:
      ``max(load) - min(load) <= max(sizes)`` (0 when ``sizes`` is empty);
    * with more servers than tensors, the extra servers get empty lists.

    Raises :class:`ValueError` when ``n_servers < 1`` or a size is negative.
    """
    if n_servers < 1:
        raise ValueError(f"n_servers must be at least 1, got {n_servers}")
    negative = [i for i, s in enumerate(sizes) if s < 0]
    if negative:
        raise ValueError(f"tensor sizes must be >= 0; negative at indices {negative}")
    shards: list[list[int]] = [[] for _ in range(n_servers)]
    loads = [0] * n_servers
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(n_servers), key=lambda k: (loads[k], k))
        shards[target].append(index)
        loads[target] += sizes[index]
    return [sorted(shard) for shard in shards]


def shard_loads(sizes: Sequence[int], plan: Sequence[Sequence[int]]) -> list[int]:
    """Total size held by each server of ``plan`` (as made by :func:`plan_shards`)."""
    return [sum(sizes[i] for i in shard) for shard in plan]
