"""Pure tests of ``dmlctl bench ps``: ratio math, parsing, rendering, job and option checks."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console, RenderableType

from dmlctl.bench.comm import BENCH_DIR
from dmlctl.bench.ps import WORKER_SCRIPT, local_bench_cluster, ps_job
from dmlctl.bench.ps_report import (
    GOAL,
    PsResult,
    parse_ps_metrics,
    ps_json,
    ps_result,
    ps_summary,
    record_values,
    render_ps_table,
)
from dmlctl.bench.report import Sweep
from dmlctl.cli.app import main
from dmlctl.errors import UsageError
from dmlctl.spec.cluster import ClusterSpec, HostSpec


def render(renderable: RenderableType, width: int = 120) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
    console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def result(nbytes: int, round_ms: float, allreduce_ms: float) -> PsResult:
    return ps_result(
        nbytes, workers=2, servers=1, round_s=round_ms / 1e3, allreduce_s=allreduce_ms / 1e3
    )


def line(r: PsResult, rank: int = 0) -> str:
    return json.dumps(
        {
            "ts": 1.0,
            "host": "local",
            "rank": rank,
            "step": 0,
            "values": {"role": "worker", **record_values(r)},
        }
    )


# --- definitions -----------------------------------------------------------------------


def test_ps_result_derives_throughputs_and_ratio_from_the_two_times() -> None:
    r = result(16 << 20, round_ms=40.0, allreduce_ms=20.0)
    assert (r.bytes, r.count, r.workers, r.servers) == (16 << 20, 4 << 20, 2, 1)
    assert r.ps_round_us == pytest.approx(40_000.0) and r.allreduce_us == pytest.approx(20_000.0)
    assert r.ps_bytes_per_s == pytest.approx((16 << 20) / 0.040)
    assert r.allreduce_bytes_per_s == pytest.approx((16 << 20) / 0.020)
    assert r.ratio == pytest.approx(0.5)  # = allreduce time / round time
    assert result(1024, round_ms=1.0, allreduce_ms=3.0).ratio == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("nbytes", "round_s", "allreduce_s", "match"),
    [
        (0, 1.0, 1.0, "multiple of 4"),
        (1022, 1.0, 1.0, "multiple of 4"),
        (1024, 0.0, 1.0, "round time"),
        (1024, 1.0, -1.0, "allreduce time"),
        (1024, math.inf, 1.0, "round time"),
        (1024, 1.0, math.nan, "allreduce time"),
    ],
)
def test_ps_result_rejects_impossible_measurements(
    nbytes: int, round_s: float, allreduce_s: float, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        ps_result(nbytes, workers=1, servers=1, round_s=round_s, allreduce_s=allreduce_s)


# --- parsing metrics.jsonl -------------------------------------------------------------


def test_parse_ps_metrics_round_trips_records_sorted_by_size() -> None:
    big, small = result(4 << 20, 10.0, 5.0), result(64 << 10, 1.0, 2.0)
    assert parse_ps_metrics([line(big), line(small)]) == [small, big]


def test_parse_ps_metrics_skips_per_rank_records_noise_and_torn_lines() -> None:
    first, last = result(1024, 1.0, 1.0), result(1024, 2.0, 1.0)
    per_rank = json.dumps(
        {"rank": 1, "values": {"bench": "ps-rank", "bytes": 1024, "local_push_us": 1.0}}
    )
    comm = json.dumps({"values": {"op": "allreduce", "bytes": 1024, "ratio": 1.0}})
    wrong_type = json.dumps({"values": {**record_values(first), "ratio": "fast"}})
    lines = [
        "",
        "not json",
        "[1]",
        per_rank,
        comm,
        wrong_type,
        line(first),
        line(last),
        line(result(4096, 1.0, 1.0))[:-12],
    ]
    assert parse_ps_metrics(lines) == [last]


def test_parse_ps_metrics_accepts_bare_value_objects() -> None:
    r = result(4096, 2.0, 1.0)
    assert parse_ps_metrics([json.dumps(record_values(r))]) == [r]


# --- rendering -------------------------------------------------------------------------


def sample() -> list[PsResult]:
    return [result(64 << 10, 1.0, 0.5), result(16 << 20, 40.0, 24.0)]


def test_table_has_one_row_per_size_with_mb_per_s_and_ratio() -> None:
    out = render(render_ps_table(sample(), workers=2, servers=1))
    assert "parameter-server benchmark, 2 workers + 1 servers" in out
    for header in (
        "size",
        "round (us)",
        "PS push+pull (MB/s)",
        "allreduce (us)",
        "allreduce (MB/s)",
        "ratio",
    ):
        assert header in out
    row = next(r for r in out.splitlines() if "16 MiB" in r)
    cells = [c.strip() for c in row.split("│")]
    # 16 MiB = 16.777216 MB: in 40 ms 419.4 MB/s, in 24 ms 699.1 MB/s; ratio 24/40.
    assert cells == ["16 MiB", "40000.0", "419.4", "24000.0", "699.1", "0.60"]
    assert "64 KiB" in out


def test_summary_names_the_ratio_at_the_largest_size_and_the_goal() -> None:
    assert ps_summary(sample()) == f"ratio at the largest size: 0.60 (goal ≥ {GOAL:g})"
    assert ps_summary(list(reversed(sample()))).startswith("ratio at the largest size: 0.60")
    assert ps_summary([]) == "ratio at the largest size: n/a (goal ≥ 0.5)"
    assert "2 workers" in render(render_ps_table([], workers=2, servers=3))


def test_json_lists_results_and_the_ratio_at_the_largest_size() -> None:
    data = ps_json(sample(), workers=2, servers=1)
    assert (data["workers"], data["servers"], data["goal"]) == (2, 1, 0.5)
    assert [r["bytes"] for r in data["results"]] == [64 << 10, 16 << 20]
    assert set(data["results"][0]) == {
        "bytes",
        "count",
        "workers",
        "servers",
        "ps_round_us",
        "allreduce_us",
        "ps_bytes_per_s",
        "allreduce_bytes_per_s",
        "ratio",
    }
    assert data["ratio_at_largest"] == pytest.approx(0.6)
    assert ps_json([], 1, 1)["ratio_at_largest"] is None
    json.dumps(data)


# --- job building and options ----------------------------------------------------------


def test_ps_job_runs_the_worker_on_workers_plus_servers_ranks_without_restarts() -> None:
    job = ps_job(workers=3, servers=2, sweep=Sweep(1024, 4096, 7, 2))
    assert job.name == "bench-ps" and job.workers == 5 and job.strategy.name == "ssgd"
    assert Path(job.workdir) == BENCH_DIR and job.script == WORKER_SCRIPT
    assert (BENCH_DIR / job.script).is_file()
    assert job.args == [
        "--servers",
        "2",
        "--min-bytes",
        "1024",
        "--max-bytes",
        "4096",
        "--factor",
        "4",
        "--iters",
        "7",
        "--warmup",
        "2",
    ]
    assert job.restart.max_user_restarts == 0 and job.restart.max_infra_restarts == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"workers": 0}, "--workers"),
        ({"servers": 0}, "--servers"),
        ({"min_bytes": 0}, "min-bytes"),
        ({"max_bytes": 10}, "min-bytes"),
        ({"servers": 300}, "at least one float32"),
        ({"iters": 0}, "--iters"),
        ({"warmup": -1}, "--warmup"),
    ],
)
def test_ps_job_rejects_bad_options(kwargs: dict[str, int], match: str) -> None:
    options = {
        "workers": 2,
        "servers": 1,
        "min_bytes": 1024,
        "max_bytes": 4096,
        "iters": 1,
        "warmup": 0,
        **kwargs,
    }
    workers, servers = options.pop("workers"), options.pop("servers")
    with pytest.raises(UsageError, match=match):
        ps_job(workers=workers, servers=servers, sweep=Sweep(**options))


def test_local_bench_cluster_makes_room_for_every_rank_on_one_host() -> None:
    one = ClusterSpec(hosts=[HostSpec(name="local", address="localhost", slots=2)])
    widened = local_bench_cluster(one, 3)
    assert widened.total_slots == 3 and widened.hosts[0].name == "local"
    assert local_bench_cluster(one, 2) is one
    two = ClusterSpec(
        hosts=[
            HostSpec(name="a", address="localhost", slots=1),
            HostSpec(name="b", address="b.example", slots=1),
        ]
    )
    assert local_bench_cluster(two, 3) is two


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--workers", "0"], "--workers >= 1"),
        (["--servers", "0"], "--servers >= 1"),
        (["--iters", "0"], "--iters >= 1"),
        (["--max-bytes", "1K"], "min-bytes <= max-bytes"),
        (["--min-bytes", "lots"], "not a size"),
    ],
)
def test_cli_rejects_bad_options_with_one_line_and_no_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    expected: str,
) -> None:
    monkeypatch.setenv("DMLCTL_HOME", str(tmp_path))
    assert main(["bench", "ps", *args]) == 2
    out, err = capsys.readouterr()
    assert expected in err and "Traceback" not in out + err
    assert not (tmp_path / "runs").exists()
