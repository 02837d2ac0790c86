"""Cyclades' planner (pure): conflict-graph components, balanced assignment of whole
components, and the properties serializability rests on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dmlctl.strategies.cyclades.plan import assign, components, plan_round
from dmlctl.strategies.cyclades.strategy import derive_sample_size

coords_lists = st.lists(st.lists(st.integers(0, 40), max_size=4), max_size=60)


def test_components_join_updates_through_shared_coordinates() -> None:
    # 0–2 share 5, 2–4 share 7 (so 0, 2, 4 are one component); 1 and 3 alone; 5 empty
    coords = [[1, 5], [2], [5, 7], [3], [7, 9], []]
    assert components(coords) == [[0, 2, 4], [1], [3], [5]]


def test_assign_gives_largest_first_to_the_least_loaded_worker() -> None:
    parts = [[0, 2, 4], [1], [3, 6], [5]]
    # sizes 3, 1, 2, 1: 3 → w0, 2 → w1, 1 ([1]) → w1, 1 ([5]) → w0 (3 vs 3: lower rank)
    assert assign(parts, 2) == [[[0, 2, 4], [5]], [[1], [3, 6]]]
    assert assign([], 3) == [[], [], []]


@settings(max_examples=200, deadline=None)
@given(coords=coords_lists, workers=st.integers(1, 5))
def test_a_plan_never_splits_a_component_and_keeps_workers_apart(
    coords: list[list[int]], workers: int
) -> None:
    plan = plan_round(coords, workers)
    assert len(plan) == workers
    parts = components(coords)
    given_out = [tuple(p) for lists in plan for p in lists]
    assert sorted(given_out) == sorted(tuple(p) for p in parts)  # whole components, once
    updates = [i for lists in plan for p in lists for i in p]
    assert sorted(updates) == list(range(len(coords)))  # every update exactly once
    touched = [{c for p in lists for i in p for c in coords[i]} for lists in plan]
    for a in range(workers):
        for b in range(a + 1, workers):
            assert not touched[a] & touched[b]  # no coordinate on two workers
    loads = [sum(len(p) for p in lists) for lists in plan]
    biggest = max((len(p) for p in parts), default=0)
    assert max(loads, default=0) <= len(coords) / workers + biggest  # greedy LPT's bound
    for lists in plan:
        assert [p[0] for p in lists] == sorted(p[0] for p in lists)  # sampled order kept
        assert all(p == sorted(p) for p in lists)


def test_default_sample_size_aims_at_one_conflict_per_update() -> None:
    # 20,000 features, 10 active per sample: 20000 / 100 = 200
    coords = [[i * 10 + k for k in range(10)] for i in range(1999)] + [[19_999] * 10]
    assert derive_sample_size(coords) == 200
    assert derive_sample_size([[0]]) == 1
