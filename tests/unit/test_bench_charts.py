"""``dmlctl bench … --plot FILE``: every bench has the option and a chart of its
``--json`` report, built here from the benches' own report producers where they run
without ranks, and checked to be a PNG with something drawn on it."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import typer.main

from dmlctl.bench import charts
from dmlctl.bench.hangs import Outcome
from dmlctl.bench.launch_overhead import run_launch_bench
from dmlctl.bench.ps_report import PsResult, ps_json
from dmlctl.bench.recovery import RecoveryReport
from dmlctl.bench.report import CommResult, comm_json
from dmlctl.bench.sparse import SparseRun, sparse_json
from dmlctl.bench.straggler import FACTOR
from dmlctl.bench.straggler_report import straggler_json
from dmlctl.cli.app import main
from dmlctl.cli.bench import app as bench_app
from dmlctl.ui.plot import Bars, Lines, Samples
from tests.unit.test_bench_parallel import sample_report
from tests.unit.test_bench_recovery import recovery
from tests.unit.test_bench_straggler import sample_results


def _launch_report(tmp_path: Path) -> dict[str, Any]:
    times = itertools.cycle([2.1, 1.9, 2.3, 1.8, 2.0, 1.7])

    def timer(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> float:
        return next(times)

    from rich.console import Console

    return run_launch_bench(5, 2, console=Console(quiet=True), home=tmp_path, timer=timer)


def _reports(tmp_path: Path) -> dict[str, dict[str, Any]]:
    sizes = [1024 * 4**i for i in range(5)]
    comm = [
        CommResult(op, b, b // 4, "float32", 10.0 + b / 1e3, b / 1e4, b / 9e3)
        for op in ("allreduce", "broadcast")
        for b in sizes
    ]
    ps = [PsResult(b, b // 4, 2, 1, 50.0, 40.0, b / 5e-5, b / 4e-5, 0.8) for b in sizes]
    samples = {"median": 1000.0, "min": 990.0, "max": 1010.0, "samples": [990.0, 1000.0, 1010.0]}
    rec = RecoveryReport(
        {
            "dmlctl": (recovery(6.0, detected=0.1), recovery(5.0, detected=0.2)),
            "torchrun": (recovery(4.0, detected=0.2), recovery(5.0)),
        },
        backoff_s=0.1,
    )
    curve = [[4.0 + i, 1000.0 * i, 0.5 + 0.1 * i] for i in range(5)]
    return {
        "advise": {
            "target": "test_acc>=0.9",
            "metric": "test_acc",
            "scenarios": [
                {
                    "name": "this machine",
                    "candidates": [
                        {"label": "ssgd", "curve": curve},
                        {
                            "label": "local-sgd period=8",
                            "curve": [[t - 1, b / 8, v] for t, b, v in curve],
                        },
                        {"label": "bmuf", "curve": []},  # failed: nothing to draw
                    ],
                }
            ],
        },
        "comm": comm_json(comm, 2),
        "ps": ps_json(ps, 2, 1),
        "launch": _launch_report(tmp_path),
        "strategies": {
            "workers": 2,
            "throughput_ratio": 0.99,
            "dmlctl_samples_per_s": samples,
            "bare_samples_per_s": samples,
            "bytes": {
                "ssgd": {"bytes_per_step": 4000, "ratio": 1.0, "goal": None},
                "local-sgd": {"bytes_per_step": 1000, "ratio": 0.25, "goal": 0.3},
                "powersgd": {"status": "pending", "goal": 0.2},
            },
            "filters": {
                "asgd": {"bytes_per_step": 8000, "against": None},
                "asgd push int8": {"bytes_per_step": 5000, "ratio": 0.625, "against": "asgd"},
            },
            "overlap": {
                name: {
                    "false": {"samples_per_s": {"median": 100.0}},
                    "true": {"samples_per_s": {"median": 130.0}},
                    "ratio": 1.3,
                }
                for name in ("asgd", "aadmm")
            },
        },
        "accuracy": {
            "metric": "validation loss",
            "data": "a generated text",
            "epochs": 3,
            "optimizers": ["adamw", "nesterov"],
            "labels": {"adamw": "AdamW", "nesterov": "SGD + Nesterov"},
            "baseline": {"adamw": 0.635, "nesterov": 0.677},
            "rows": [
                {"name": "ssgd", "value": {"adamw": 0.635, "nesterov": 0.677}},
                {"name": "bmuf", "value": {"adamw": 0.645, "nesterov": 0.677}},
            ],
        },
        "recovery": rec.to_dict(),
        "straggler": straggler_json(
            sample_results(), steps=60, step_sleep=0.03, factor=FACTOR, repeats=1
        ),
        "sparse": sparse_json(
            [
                SparseRun("hogwild", "h1", 30_000.0, 0.297, 0.860),
                SparseRun("cyclades", "c1", 23_000.0, 0.297, 0.859),
                SparseRun("hogwild", "h2", 29_000.0, 0.297, 0.861),
                SparseRun("cyclades", "c2", 22_000.0, 0.296, 0.860),
            ],
            workers=2,
            samples=100_000,
            batch_size=4,
        ),
        "logs": {
            "carried": {"lines": 2_000_000, "seconds": 4.0, "lines_per_s": 500_000.0},
            "loop": {"stdout_s": [2.1, 2.0, 2.2], "devnull_s": [2.0, 2.0, 2.1], "slowdown": 0.03},
            "goal_lines_per_s": 200_000,
            "goal_slowdown": 0.05,
        },
        "parallel": sample_report(),
        "hangs": {
            "hang_timeout": 30.0,
            "goal_delay_s": 32.0,
            "scenarios": [
                Outcome("prep", runs=3, hung=0).to_dict(),
                Outcome("deadlock", runs=3, hung=3, named=3, delays=[30.5, 31.0, 30.8]).to_dict(),
            ],
        },
    }


def _bench_commands() -> dict[str, Any]:
    group: Any = typer.main.get_command(bench_app)
    return dict(group.commands)


def test_every_bench_takes_plot_and_has_a_chart() -> None:
    commands = _bench_commands()
    assert set(commands) == set(charts.CHARTS)
    for name, command in commands.items():
        plot = [p for p in command.params if "--plot" in getattr(p, "opts", [])]
        assert plot and plot[0].metavar == "FILE", name


def test_charts_read_the_json_reports(tmp_path: Path) -> None:
    reports = _reports(tmp_path)
    assert set(reports) == set(charts.CHARTS)
    title, panels = charts.CHARTS["straggler"](reports["straggler"])
    assert "3× slower" in title
    (bars,) = panels
    assert isinstance(bars, Bars) and list(bars.groups) == [
        "ssgd",
        "asgd",
        "ssp-s3",
        "ssp-s12-burst",
        "sync-ps-b1",
    ]
    assert bars.refs["no straggler"] == 1.0
    _, (runs, stages) = charts.CHARTS["recovery"](reports["recovery"])
    assert isinstance(runs, Samples) and runs.groups["dmlctl"] == [6.0, 5.0]
    assert isinstance(stages, Bars) and list(stages.groups) == ["detected", "first_step"]
    _, (_, bytes_bars, overlap) = charts.CHARTS["strategies"](reports["strategies"])
    assert isinstance(bytes_bars, Bars)
    assert list(bytes_bars.groups) == ["ssgd", "local-sgd", "asgd push int8"]
    assert isinstance(overlap, Bars) and overlap.bars["overlap true"] == [130.0, 130.0]
    _, (rates, ratio) = charts.CHARTS["ps"](reports["ps"])
    assert isinstance(rates, Lines) and len(rates.lines["all-reduce"]) == 5
    assert isinstance(ratio, Lines) and ratio.refs == {"goal": 0.5}
    _, (by_time, by_bytes) = charts.CHARTS["advise"](reports["advise"])
    assert isinstance(by_time, Lines) and list(by_time.lines) == ["ssgd", "local-sgd period=8"]
    assert isinstance(by_bytes, Lines) and by_bytes.refs == {"target": 0.9}
    _, (launch,) = charts.CHARTS["launch"](reports["launch"])
    assert isinstance(launch, Samples) and len(launch.groups["torchrun"]) == 5
    _, (shares, rates) = charts.CHARTS["parallel"](reports["parallel"])
    assert isinstance(shares, Bars) and shares.groups[0] == "dp4" and len(shares.refs) == 2
    assert isinstance(rates, Samples) and list(rates.refs) == ["dp4 median"]


@pytest.mark.parametrize("bench", sorted(charts.CHARTS))
def test_each_chart_is_a_png_with_something_drawn(tmp_path: Path, bench: str) -> None:
    import matplotlib.image

    out = tmp_path / f"{bench}.png"
    charts.write(bench, _reports(tmp_path)[bench], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(out)
    # Far from blank: a good share of the image is not the background.
    background = pixels[0, 0]
    drawn = (abs(pixels - background).sum(axis=-1) > 0.1).mean()
    assert drawn > 0.02, (bench, drawn)


def test_plot_without_matplotlib_stops_before_the_bench_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "matplotlib" else real(name)
    )
    for bench in ("launch", "recovery", "hangs"):
        assert main(["bench", bench, "--plot", str(tmp_path / "x.png")]) == 2
        err = capsys.readouterr().err
        assert err.strip() == "dmlctl: --plot needs matplotlib: pip install 'dmlctl[plot]'"
    assert not (tmp_path / "x.png").exists()
