"""``dmlctl bench parallel`` without its ranks: every layout's job file validates and
lays out 4 workers, the report's figures come from the right records and baselines,
the goals are checked, the table reads at 80 columns, and the runs alternate."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dmlctl.bench.parallel import (
    BASELINE,
    LAYOUTS,
    WORKERS,
    check_options,
    job_spec,
    parse_layouts,
    run_parallel_bench,
)
from dmlctl.bench.parallel_report import (
    RunFigures,
    layout_row,
    parallel_json,
    render_parallel_table,
    run_figures,
)
from dmlctl.bench.runs import BenchFailed
from dmlctl.bench.strategies import write_job
from dmlctl.cli.app import main
from dmlctl.errors import UsageError
from dmlctl.launch.api import LaunchResult
from dmlctl.spec import load_job

MODEL = {"param_bytes": 1000, "optim_bytes": 2000, "sharded_bytes": 2400}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_is_a_valid_job_of_4_workers(tmp_path: Path, name: str) -> None:
    layout = LAYOUTS[name]
    job = load_job(write_job(job_spec(layout, 20), tmp_path))
    assert job.workers == WORKERS and job.strategy.name == "ssgd"
    assert job.args[:2] == ["--steps", "20"] and job.restart.max_user_restarts == 0
    assert (Path(job.workdir) / job.script).is_file()
    if layout.parallelism is None:
        assert job.parallelism is None
    else:
        assert job.parallelism is not None
        for key, value in layout.parallelism.items():
            assert getattr(job.parallelism, key) == value


def test_layouts_and_options_are_checked() -> None:
    assert parse_layouts("all") == list(LAYOUTS)
    assert parse_layouts(" fsdp4, dp4 ") == ["dp4", "fsdp4"]
    with pytest.raises(UsageError, match="unknown tp3; choose from dp4, tp2-dp2"):
        parse_layouts("tp3,dp4")
    with pytest.raises(UsageError, match="no layout named"):
        parse_layouts(" , ")
    with pytest.raises(UsageError, match="--steps must be at least 5"):
        check_options(4, 1)
    with pytest.raises(UsageError, match="--repeats must be at least 1"):
        check_options(20, 0)


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--layouts", "dp4,tp8"], "--layouts: unknown tp8; choose from dp4, tp2-dp2, tp4, "),
        (["--steps", "4"], "--steps must be at least 5 (3 untimed + 2), got 4"),
        (["--repeats", "0"], "--repeats must be at least 1, got 0"),
    ],
)
def test_bad_flags_stop_before_any_run(
    capsys: pytest.CaptureFixture[str], flags: list[str], error: str
) -> None:
    assert main(["bench", "parallel", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dmlctl: {error}") and "\n" not in err


def _line(rank: int, **values: Any) -> str:
    return json.dumps({"rank": rank, "step": 1, "values": values})


def _lines(rate: float, replicas: int, per_rank: list[int], sharded: list[int]) -> list[str]:
    """The records of one run: a warm-up record and a timed one from every rank, the
    model's figures on rank 0; rank r holds ``per_rank[r]`` parameter bytes and twice
    that of optimizer state."""
    model = {f"model_{k}": v for k, v in MODEL.items()}
    out = ["not json", _line(0, loss=1.0)]
    for timed in (False, True):
        for rank, (held, split) in enumerate(zip(per_rank, sharded, strict=True)):
            extra = model if rank == 0 else {}
            out.append(
                _line(
                    rank,
                    samples_per_s=rate + rank if timed else 1.0,
                    replicas=replicas,
                    param_bytes=held,
                    optim_bytes=2 * held,
                    sharded_bytes=split,
                    **extra,
                )
            )
    return out


def test_run_figures_take_each_ranks_last_timed_record() -> None:
    run = run_figures("r1", _lines(10.0, 4, [1000] * 4, [2400] * 4), WORKERS)
    assert run.replicas == 4 and run.model == MODEL
    assert [run.ranks[r]["samples_per_s"] for r in range(4)] == [10.0, 11.0, 12.0, 13.0]
    with pytest.raises(BenchFailed, match="run r2 logged figures from 3 of 4 workers"):
        run_figures("r2", _lines(10.0, 4, [1000] * 3, [2400] * 3), WORKERS)
    lines = [ln for ln in _lines(1.0, 1, [1] * 4, [1] * 4) if "model_" not in ln]
    with pytest.raises(BenchFailed, match="none of the whole model"):
        run_figures("r3", lines, WORKERS)


def _run(run_id: str, rate: float, replicas: int, held: list[int], split: list[int]) -> RunFigures:
    return run_figures(run_id, _lines(rate, replicas, held, split), WORKERS)


def test_report_math() -> None:
    dp = [_run("d1", 10.0, 4, [1000] * 4, [2400] * 4), _run("d2", 20.0, 4, [1000] * 4, [2400] * 4)]
    # a pipeline-like layout: unequal ranks, one replica over the 4
    pp = [_run("p1", 30.0, 1, [100, 400, 300, 200], [0, 1200, 900, 300])]
    report = parallel_json(
        {"dp4": ("data", {}), "pp4": ("pipeline", {"memory_ratio": 0.3, "sharded_ratio": 0.55})},
        {"dp4": dp, "pp4": pp},
        baseline="dp4",
        setup={"workers": 4},
    )
    assert report["model"] == {**MODEL, "bytes": 3000} and report["workers"] == 4
    d, p = report["layouts"]["dp4"], report["layouts"]["pp4"]
    assert d["memory_bytes"] == 3000 and d["memory_ratio"] == 1.0 and d["sharded_ratio"] == 1.0
    # per replica: the mean over the ranks (10..13, 20..23), the run: times 4 replicas
    assert d["replica_samples_per_s"]["samples"] == [11.5, 21.5]
    assert d["samples_per_s"]["median"] == 4 * 16.5 and d["ratio"] == 1.0
    assert p["memory_bytes"] == 1200 and p["memory_ratio"] == 0.4
    assert p["sharded_ratio"] == 0.5 and [r["bytes"] for r in p["ranks"]] == [300, 1200, 900, 600]
    assert p["samples_per_s"]["median"] == 31.5 and p["ratio"] == pytest.approx(31.5 / 66)
    assert p["goals"]["memory_ratio"] == {"bound": 0.3, "value": 0.4, "met": False}
    assert p["goals"]["sharded_ratio"]["met"] is True and d["goals"] == {}
    alone = parallel_json({"pp4": ("pipeline", {})}, {"pp4": pp}, baseline="dp4", setup={})
    assert alone["layouts"]["pp4"]["ratio"] is None


def test_memory_is_the_largest_over_the_runs() -> None:
    row = layout_row(
        "x",
        {},
        [_run("a", 1.0, 4, [1000, 900, 900, 900], [1] * 4), _run("b", 1.0, 4, [800] * 4, [1] * 4)],
    )
    assert [r["param_bytes"] for r in row["ranks"]] == [1000, 900, 900, 900]


def sample_report() -> dict[str, Any]:
    runs = {
        name: [_run(name, 13.7 + i, 4 if name in ("dp4", "fsdp4") else 1, [1000] * 4, [600] * 4)]
        for i, name in enumerate(LAYOUTS)
    }
    layouts = {name: (layout.title, layout.goals) for name, layout in LAYOUTS.items()}
    setup = {"workers": 4, "steps": 20, "warmup_steps": 3, "global_batch": 32, "repeats": 1}
    return parallel_json(layouts, runs, baseline=BASELINE, setup=setup)


def test_table_renders_every_layout_and_goal_at_80_columns() -> None:
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(render_parallel_table(sample_report()))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    for name in LAYOUTS:
        assert name in text
    assert "1.000 ✗" in text and "0.250 ✓" in text  # fsdp4's memory, tp2-dp2's layers
    caption = " ".join(text.split())  # its lines wrap where the width ends
    assert "tp2-dp2 tp layers ≤ 0.55 (0.250, met); fsdp4 memory ≤ 0.3 (1.000, NOT met)" in caption
    assert " 60.8 " in text and " 15.2 " in text  # dp4: mean of 13.7..16.7, × 4 replicas


def test_runs_alternate_through_the_layouts(tmp_path: Path) -> None:
    launched: list[str] = []

    def launcher(job: Any, cluster: Any, *, options: Any, console: Any) -> LaunchResult:
        assert cluster.total_slots >= WORKERS and options.ui == "quiet"
        run_dir = tmp_path / f"run{len(launched)}"
        run_dir.mkdir()
        name = job.name.removeprefix("bench-parallel-")
        replicas = 4 if job.parallelism is None else 1
        lines = _lines(10.0, replicas, [1000] * 4, [600] * 4)
        (run_dir / "metrics.jsonl").write_text("\n".join(lines), encoding="utf-8")
        launched.append(name)
        return LaunchResult(run_dir.name, run_dir, None, 0)

    report = run_parallel_bench(
        ["dp4", "tp4"], steps=5, repeats=2, console=Console(quiet=True), launcher=launcher
    )
    assert launched == ["dp4", "tp4", "dp4", "tp4"]
    assert report["layouts"]["tp4"]["run_ids"] == ["run1", "run3"]
    assert report["layouts"]["tp4"]["ratio"] == pytest.approx(11.5 / 46)
    assert report["failed_runs"] == []


def test_a_failed_run_is_launched_once_more_and_reported(tmp_path: Path) -> None:
    exits = iter([1, 0, 1, 1])

    def launcher(job: Any, cluster: Any, *, options: Any, console: Any) -> LaunchResult:
        run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        run_dir.mkdir()
        lines = _lines(10.0, 4, [1000] * 4, [600] * 4)
        (run_dir / "metrics.jsonl").write_text("\n".join(lines), encoding="utf-8")
        return LaunchResult(run_dir.name, run_dir, None, next(exits))

    console = Console(quiet=True)
    report = run_parallel_bench(["dp4"], steps=5, repeats=1, console=console, launcher=launcher)
    assert report["layouts"]["dp4"]["run_ids"] == ["run1"]
    assert report["failed_runs"] == [
        "benchmark run run0 failed: exit code 1 (see `dmlctl logs run0`)"
    ]
    with pytest.raises(BenchFailed, match="run run3 failed: exit code 1"):
        run_parallel_bench(["dp4"], steps=5, repeats=1, console=console, launcher=launcher)


def test_a_run_stopped_by_ctrl_c_ends_the_bench_instead_of_being_launched_again(
    tmp_path: Path,
) -> None:
    from dmlctl.bench.runs import BenchInterrupted

    launched: list[str] = []

    def launcher(job: Any, cluster: Any, *, options: Any, console: Any) -> LaunchResult:
        launched.append(job.name)
        return LaunchResult(f"run{len(launched)}", tmp_path, None, 130)  # stopped

    with pytest.raises(BenchInterrupted, match="run run1 was stopped") as info:
        run_parallel_bench(
            ["dp4", "tp4"], steps=5, repeats=2, console=Console(quiet=True), launcher=launcher
        )
    assert len(launched) == 1 and info.value.exit_code == 130


def test_a_whole_replica_holds_what_the_reference_measures() -> None:
    import torch

    from dmlctl.bench.parallel_job.memory import held, reference, split_names, whole_name
    from dmlctl.bench.parallel_job.model import Config, transformer

    cfg = Config(vocab=16, context=8, dim=32, heads=2, layers=2, hidden=64)
    net = transformer(cfg)
    split = split_names(net)
    assert {"1.attention.wq.weight", "2.feed_forward.w2.bias"} <= split
    assert not {"0.tokens.weight", "1.norm1.weight", "3.out.weight"} & split
    assert whole_name("module.1.attention.wq.weight") == "1.attention.wq.weight"
    assert whole_name("stages.1.3.out.weight") == "3.out.weight"
    params = list(net.parameters())
    numel = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params)
    assert held(net, opt, split) == {
        "param_bytes": 4 * numel,
        "optim_bytes": 0,  # no state before the first step
        "sharded_bytes": 4 * sum(p.numel() for n, p in net.named_parameters() if n in split),
    }
    expected = torch.rand(1, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    ref = reference(cfg, split, 1e-3)
    assert ref["model_param_bytes"] == 4 * numel
    assert ref["model_optim_bytes"] == 2 * 4 * numel + 4 * len(params)  # exp_avg(_sq), step
    assert torch.equal(torch.rand(1), expected)  # the global RNG left as it was
