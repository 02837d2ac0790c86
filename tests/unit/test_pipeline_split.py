"""The pipeline split: contiguous stages whose largest parameter count is the smallest
any contiguous split achieves (checked against every split of small cases)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from dmlctl.runtime.parallel.pipeline import _balanced_cuts, split_sequential


def _largest(sizes: list[int], cuts: list[int]) -> int:
    bounds = [0, *cuts, len(sizes)]
    return max(sum(sizes[a:b]) for a, b in itertools.pairwise(bounds))


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=8), st.data())
def test_the_largest_stage_is_as_small_as_any_contiguous_split_makes_it(
    sizes: list[int], data: st.DataObject
) -> None:
    n = data.draw(st.integers(min_value=1, max_value=len(sizes)))
    cuts = _balanced_cuts(sizes, n)
    assert len(cuts) == n - 1 and cuts == sorted(set(cuts))
    assert all(0 < c < len(sizes) for c in cuts)  # every stage non-empty
    best = min(
        _largest(sizes, list(c)) for c in itertools.combinations(range(1, len(sizes)), n - 1)
    )
    assert _largest(sizes, cuts) == best


def test_stages_keep_the_children_and_their_names() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 400), nn.Linear(400, 4))
    stages = split_sequential(model, 2)
    assert [list(dict(s.named_children())) for s in stages] == [["0", "1", "2"], ["3"]]
    with pytest.raises(ValueError, match="fewer than the 5 pipeline stages"):
        split_sequential(model, 5)
    with pytest.raises(ValueError, match=r"splits an nn\.Sequential"):
        split_sequential(nn.Linear(2, 2), 2)
