"""The device-mesh layout both planes share (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dmlctl.mesh import MeshLayout, dumps, loads, schedule_name

degrees = st.integers(min_value=1, max_value=4)


@given(degrees, degrees, degrees, degrees)
def test_coordinates_round_trip_and_groups_partition_the_workers(
    pp: int, rep: int, shard: int, tp: int
) -> None:
    layout = MeshLayout(pp=pp, dp_replicate=rep, dp_shard=shard, tp=tp)
    for rank in range(layout.world):
        assert layout.rank_of(layout.coords(rank)) == rank
    for dim, size in layout.sizes.items():
        groups = layout.groups(dim)
        assert sorted(r for g in groups for r in g) == list(range(layout.world))
        assert all(len(g) == size for g in groups)


def test_tensor_parallel_peers_are_neighbours_and_stages_are_outermost() -> None:
    layout = MeshLayout(pp=2, dp_replicate=2, tp=2)
    assert layout.names == ("pp", "dp_replicate", "tp") and layout.shape == (2, 2, 2)
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("dp_replicate") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.label(5) == "pp1 dp0 tp1"


def test_stages_per_schedule() -> None:
    assert MeshLayout(pp=2, schedule="GPipe").stages(1) == [1]
    assert MeshLayout(pp=2, schedule="Interleaved1F1B").stages(1) == [1, 3]
    assert MeshLayout(pp=2, schedule="ZBVZeroBubble").stages(0) == [0, 3]
    assert MeshLayout(pp=4, schedule="loopedbfs").n_stages == 8
    assert MeshLayout(pp=2, schedule="Interleaved1F1B").label(1) == "pp1 stages 1,3"
    assert schedule_name("1f1b") == "1F1B" and schedule_name("2F2B") is None


def test_a_plain_layout_still_has_one_dimension() -> None:
    layout = MeshLayout(dp_replicate=4)
    assert layout.names == ("dp_replicate",) and MeshLayout().names == ("dp_replicate",)
    assert layout.describe() == [
        "device mesh: dp_replicate 4 (4 workers)",
        "  dp_replicate groups: [0, 1, 2, 3]",
    ]


def test_the_json_form_round_trips_and_refuses_anything_else() -> None:
    layout = MeshLayout(pp=2, tp=2, schedule="GPipe", microbatches=4)
    assert loads(dumps(layout)) == layout
    for bad in ("{", '{"pp": 0}', '{"schedule": "nope"}', '{"mesh": 2}'):
        with pytest.raises(ValueError, match="not a mesh layout"):
            loads(bad)
