"""``dmlctl plot RUN``: a PNG of loss, samples/s and comm share per rank over time."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from dmlctl.cli.app import main
from dmlctl.runs.store import RunStore
from dmlctl.ui.plot import series
from tests.unit.test_runs import add_run

RUN = "train-20260101-000000-abcd"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunStore:
    monkeypatch.setenv("DMLCTL_HOME", str(tmp_path / "home"))
    return RunStore(tmp_path / "home")


def _metrics(store: RunStore, n: int = 50) -> Path:
    run = add_run(store, RUN)
    records = [
        {
            "ts": 100.0 + i,
            "host": "local",
            "rank": rank,
            "step": i,
            "values": {"loss": 2.0 / (i + 1) + rank, "samples_per_s": 1000 + i, "comm_share": 0.3},
        }
        for i in range(n)
        for rank in (0, 1)
    ]
    lines = [json.dumps(r) for r in records] + ["not json"]
    run.metrics.write_text("\n".join(lines) + "\n")
    return run.path


def test_series_per_key_and_rank_from_the_first_record(store: RunStore) -> None:
    path = _metrics(store, 3)
    data = series(path / "metrics.jsonl")
    assert data["loss"][1] == [(0.0, 3.0), (1.0, 2.0), (2.0, 2.0 / 3 + 1)]
    assert set(data["samples_per_s"]) == {0, 1}


def test_plot_writes_a_png(
    store: RunStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _metrics(store)
    out = tmp_path / "run.png"
    assert main(["plot", RUN[:12], "-o", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # three panels drawn
    assert capsys.readouterr().out.strip() == str(out)


def test_a_run_without_metrics_or_matplotlib_is_one_line_and_exit_2(
    store: RunStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    add_run(store, RUN)
    assert main(["plot", RUN]) == 2
    assert "logged no loss, samples/s or comm share to plot" in capsys.readouterr().err
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "matplotlib" else real(name)
    )
    assert main(["plot", RUN]) == 2
    assert "dmlctl plot needs matplotlib: pip install 'dmlctl[plot]'" in capsys.readouterr().err


def test_a_rank_replaced_in_place_is_shaded_from_its_loss_to_its_return(
    store: RunStore, tmp_path: Path
) -> None:
    import matplotlib.image

    from dmlctl.runs.state import Replacement
    from dmlctl.ui.plot import plot_run

    path = _metrics(store)

    def shaded(gaps: tuple[Replacement, ...]) -> int:
        """Pixels of the span's colour (orange at 30 % on white)."""
        out = tmp_path / f"gaps{len(gaps)}.png"
        plot_run(path, out, "t", gaps, world=2)
        rgb = matplotlib.image.imread(out)[..., :3]
        near = (abs(rgb[..., 0] - 1.0) < 0.01) & (abs(rgb[..., 1] - 0.89) < 0.015)
        return int((near & (abs(rgb[..., 2] - 0.70) < 0.015)).sum())

    gap = Replacement(1, "local", 110.0, "killed by SIGKILL", 120.0, 20)
    bare = shaded(())  # a few anti-aliased pixels of rank 1's orange line
    assert shaded((gap,)) > bare + 3 * 5_000  # three panels, a fifth of each one's width
    assert gap.gap_s == 10.0


def test_the_ranks_running_step_down_at_a_loss_and_up_at_the_return() -> None:
    from dmlctl.runs.state import Replacement
    from dmlctl.ui.plot import world_over_time

    back = Replacement(1, "local", 110.0, "killed by SIGKILL", 112.5, 20)
    open_ = Replacement(3, "local", 111.0, "killed by SIGKILL", None, None)
    assert world_over_time((back, open_), 4, 100.0, 30.0) == [
        (0.0, 4),
        (10.0, 3),
        (11.0, 2),
        (12.5, 3),
        (30.0, 3),
    ]
    assert world_over_time((), 2, 0.0, 5.0) == [(0.0, 2), (5.0, 2)]
    again = Replacement(1, "local", 110.5, "killed by SIGKILL", 112.5, 20)  # while it rejoined
    assert [n for _, n in world_over_time((back, again), 2, 100.0, 30.0)] == [2, 1, 1, 2, 2, 2]
