"""Communication graphs for decentralized (gossip) averaging, and their mixing matrices.

Pure Python (no torch): the control plane and the unit tests import it freely.

A topology on ``n`` workers is an undirected graph; worker ``i`` averages its own
model with those of its neighbours ``N(i)`` using the weights of row ``i`` of the
mixing matrix ``W``:

    xᵢ ← Σⱼ Wᵢⱼ xⱼ        (j ∈ N(i) ∪ {i})

Weights are Metropolis–Hastings weights, ``Wᵢⱼ = 1 / (1 + max(dᵢ, dⱼ))`` for an edge
``i–j`` (``dᵢ`` = degree of ``i``) and ``Wᵢᵢ = 1 − Σⱼ≠ᵢ Wᵢⱼ``. On an undirected graph
they are symmetric, non-negative and every row sums to 1, so ``W`` is **doubly
stochastic**: one mixing round keeps the mean of the workers' models exactly
(columns sum to 1) and, on a connected graph, repeated rounds drive every model to
that mean. All graphs here are circulant (every node has the same degree ``d``), so
the weights are uniform: ``1 / (d + 1)`` for each neighbour and for oneself.

Topologies (:data:`TOPOLOGIES`):

* ``ring`` — neighbours ``i ± 1 (mod n)``: weight 1/3 each and 1/3 for oneself;
  ``n = 2`` → 1/2 and 1/2; ``n = 1`` → the identity.
* ``exponential`` — the *static*, symmetric exponential graph: neighbours at
  distance ``±2ᵏ (mod n)`` for every ``2ᵏ < n`` (k = 0, 1, …), i.e. O(log n) peers.
  (The one-peer-per-step time-varying variant is not implemented; the static graph
  keeps W fixed and doubly stochastic for every ``n``.)
* ``complete`` — everyone: ``Wᵢⱼ = 1/n``, i.e. one round equals global averaging.
"""

from __future__ import annotations

TOPOLOGIES: tuple[str, ...] = ("ring", "exponential", "complete")


def _check(name: str, n: int) -> None:
    if name not in TOPOLOGIES:
        raise ValueError(f"unknown topology {name!r}; valid: {', '.join(TOPOLOGIES)}")
    if n < 1:
        raise ValueError(f"number of workers must be at least 1, got {n}")


def _offsets(name: str, n: int) -> list[int]:
    """Positive distances ``o`` such that ``i`` is linked to ``i ± o (mod n)``."""
    if name == "ring":
        return [1]
    if name == "exponential":
        offsets, step = [], 1
        while step < n:
            offsets.append(step)
            step *= 2
        return offsets
    return list(range(1, n))  # complete


def peers(name: str, n: int, rank: int) -> list[int]:
    """The neighbours of ``rank`` (itself excluded), sorted; empty when ``n = 1``."""
    _check(name, n)
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} out of range for {n} workers")
    linked = {(rank + s * o) % n for o in _offsets(name, n) for s in (1, -1)}
    linked.discard(rank)
    return sorted(linked)


def neighbours(name: str, n: int, rank: int) -> dict[int, float]:
    """Row ``rank`` of the mixing matrix as ``{peer: weight}``, ``rank`` itself
    included; the weights sum to 1. Raises ValueError for an unknown topology."""
    own = peers(name, n, rank)
    row: dict[int, float] = {}
    for j in own:
        row[j] = 1.0 / (1 + max(len(own), len(peers(name, n, j))))
    row[rank] = 1.0 - sum(row.values())
    return dict(sorted(row.items()))


def mixing_matrix(name: str, n: int) -> list[list[float]]:
    """The ``n × n`` mixing matrix ``W`` (row i = :func:`neighbours` of i)."""
    _check(name, n)
    matrix = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j, w in neighbours(name, n, i).items():
            matrix[i][j] = w
    return matrix


def is_doubly_stochastic(matrix: list[list[float]], tol: float = 1e-9) -> bool:
    """Square, non-negative, every row and every column summing to 1 (within ``tol``)."""
    n = len(matrix)
    if n == 0 or any(len(row) != n for row in matrix):
        return False
    if any(w < -tol for row in matrix for w in row):
        return False
    rows_ok = all(abs(sum(row) - 1.0) <= tol for row in matrix)
    cols_ok = all(abs(sum(matrix[i][j] for i in range(n)) - 1.0) <= tol for j in range(n))
    return rows_ok and cols_ok
