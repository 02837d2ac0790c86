"""Pure tests of the benchmark report: sizes, bus factors, parsing, rendering, job building."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from rich.console import Console, RenderableType

from dmlctl.bench.comm import BENCH_DIR, WORKER_SCRIPT, comm_job
from dmlctl.bench.launch_overhead import (
    dmlctl_command,
    render_launch_table,
    run_launch_bench,
    torchrun_command,
)
from dmlctl.bench.report import (
    CommResult,
    Sweep,
    bus_factor,
    comm_json,
    human_size,
    parse_metrics,
    parse_ops,
    parse_size,
    render_comm_table,
    size_sweep,
)
from dmlctl.errors import UsageError


def render(renderable: RenderableType, width: int = 100) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
    console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def record(op: str, nbytes: int, time_us: float = 100.0, n: int = 2, **extra: object) -> str:
    algbw = nbytes / (time_us * 1e-6) / 1e9
    values = {
        "op": op,
        "bytes": nbytes,
        "count": nbytes // 4,
        "dtype": "float32",
        "time_us": time_us,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * bus_factor(op, n),
    }
    return json.dumps({"ts": 1.0, "host": "local", "rank": 0, "step": 0, "values": values, **extra})


# --- sizes and ops ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", 1024),
        ("1K", 1024),
        ("4k", 4096),
        ("16M", 16 << 20),
        ("1G", 1 << 30),
        ("16MiB", 16 << 20),
        ("64KB", 64 << 10),
        (" 8 M ", 8 << 20),
    ],
)
def test_parse_size_accepts_plain_and_binary_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "16X", "-1K", "1.5M", "0", "16 MB extra", "1T"])
def test_parse_size_rejects_junk_with_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="size"):
        parse_size(text)


def test_human_size_uses_binary_units() -> None:
    assert [human_size(n) for n in (512, 1024, 1536, 4 << 10, 16 << 20, 2 << 30)] == [
        "512 B",
        "1 KiB",
        "1.5 KiB",
        "4 KiB",
        "16 MiB",
        "2 GiB",
    ]


def test_size_sweep_is_geometric_and_inclusive() -> None:
    assert size_sweep(1024, 16 << 10, 4) == [1024, 4096, 16384]
    assert size_sweep(1024, 1024, 2) == [1024]
    assert size_sweep(1024, 5000, 4) == [1024, 4096]


@pytest.mark.parametrize(("low", "high", "factor"), [(0, 10, 2), (10, 5, 2), (1, 10, 1)])
def test_size_sweep_rejects_bad_ranges(low: int, high: int, factor: int) -> None:
    with pytest.raises(UsageError):
        size_sweep(low, high, factor)


def test_parse_ops_normalises_order_and_rejects_unknown_names() -> None:
    assert parse_ops("broadcast, allreduce,broadcast") == ("allreduce", "broadcast")
    with pytest.raises(UsageError, match=r"alltoall.*valid: allreduce, allgather, broadcast"):
        parse_ops("allreduce,alltoall")
    with pytest.raises(UsageError):
        parse_ops(" , ")


# --- bus bandwidth ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("allreduce", 1, 0.0),
        ("allreduce", 2, 1.0),
        ("allreduce", 4, 1.5),
        ("allreduce", 8, 1.75),
        ("allgather", 1, 0.0),
        ("allgather", 2, 0.5),
        ("allgather", 4, 0.75),
        ("broadcast", 1, 1.0),
        ("broadcast", 8, 1.0),
    ],
)
def test_bus_factor_matches_nccl_tests(op: str, n: int, factor: float) -> None:
    assert bus_factor(op, n) == pytest.approx(factor)


def test_bus_factor_rejects_unknown_op_and_empty_world() -> None:
    with pytest.raises(UsageError, match="unknown op"):
        bus_factor("reduce_scatter", 2)
    with pytest.raises(UsageError):
        bus_factor("allreduce", 0)


# --- parsing metrics.jsonl -------------------------------------------------------------


def test_parse_metrics_reads_records_sorted_by_op_then_size() -> None:
    lines = [
        record("broadcast", 4096),
        record("allreduce", 4096),
        record("allreduce", 1024),
        record("allgather", 1024),
    ]
    results = parse_metrics(lines)
    assert [(r.op, r.bytes) for r in results] == [
        ("allreduce", 1024),
        ("allreduce", 4096),
        ("allgather", 1024),
        ("broadcast", 4096),
    ]
    first = results[0]
    assert first == CommResult(
        "allreduce", 1024, 256, "float32", 100.0, first.algbw_gbps, first.busbw_gbps
    )
    assert first.algbw_gbps == pytest.approx(1024 / 100e-6 / 1e9)


def test_parse_metrics_skips_noise_and_torn_lines_and_keeps_the_last_duplicate() -> None:
    lines = [
        "",
        "not json",
        "[1, 2]",
        json.dumps({"values": {"loss": 0.5}}),
        json.dumps(
            {
                "values": {
                    "op": "alltoall",
                    "bytes": 1,
                    "count": 1,
                    "time_us": 1,
                    "algbw_gbps": 1,
                    "busbw_gbps": 1,
                }
            }
        ),
        record("allreduce", 1024, time_us=50.0),
        record("allreduce", 1024, time_us=70.0),
        record("allreduce", 4096)[:-10],
    ]
    results = parse_metrics(lines)
    assert [(r.op, r.bytes, r.time_us) for r in results] == [("allreduce", 1024, 70.0)]


def test_parse_metrics_accepts_the_workers_bare_printed_lines() -> None:
    bare = json.dumps({"step": 0, "values": json.loads(record("broadcast", 1024))["values"]})
    assert [r.op for r in parse_metrics([bare])] == ["broadcast"]


# --- rendering -------------------------------------------------------------------------


def sample_results() -> list[CommResult]:
    return parse_metrics(
        [
            record("allreduce", 1024, 10.0),
            record("allreduce", 4 << 20, 2000.0),
            record("allgather", 4096, 20.0),
            record("broadcast", 1024, 5.0),
        ]
    )


def test_comm_table_has_one_block_per_op_with_human_sizes() -> None:
    out = render(render_comm_table(sample_results(), world_size=2))
    assert "communication benchmark, 2 ranks" in out
    for header in ("size", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        assert header in out
    assert out.index("allreduce") < out.index("allgather") < out.index("broadcast")
    assert "1 KiB" in out and "4 MiB" in out and "float32" in out
    # 4 MiB in 2000 us: algbw 2.097 GB/s, allreduce busbw on 2 ranks = algbw.
    row = next(line for line in out.splitlines() if "4 MiB" in line)
    assert "2000.0" in row and row.count("2.097") == 2


def test_comm_table_renders_empty_results() -> None:
    assert "communication benchmark, 4 ranks" in render(render_comm_table([], world_size=4))


def test_comm_json_lists_results_and_average_bus_bandwidth() -> None:
    data = comm_json(sample_results(), world_size=2)
    assert data["world_size"] == 2
    assert [r["op"] for r in data["results"]] == [
        "allreduce",
        "allreduce",
        "allgather",
        "broadcast",
    ]
    assert set(data["results"][0]) == {
        "op",
        "bytes",
        "count",
        "dtype",
        "time_us",
        "algbw_gbps",
        "busbw_gbps",
    }
    allreduce = [r["busbw_gbps"] for r in data["results"] if r["op"] == "allreduce"]
    assert data["avg_busbw_gbps"]["allreduce"] == pytest.approx(sum(allreduce) / 2)
    json.dumps(data)


# --- job building and the launch benchmark's arithmetic --------------------------------


def test_comm_job_runs_the_worker_from_the_package_with_the_options() -> None:
    job = comm_job(workers=3, ops=("allreduce", "broadcast"), sweep=Sweep(1024, 4096, 7, 2))
    assert job.name == "bench-comm" and job.workers == 3
    assert Path(job.workdir) == BENCH_DIR and (BENCH_DIR / job.script).name == WORKER_SCRIPT
    assert (BENCH_DIR / job.script).is_file()
    assert job.args == [
        "--ops",
        "allreduce,broadcast",
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


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ops": ("alltoall",)},
        {"ops": ()},
        {"min_bytes": 0},
        {"max_bytes": 10},
        {"iters": 0},
        {"warmup": -1},
        {"workers": 0},
    ],
)
def test_comm_job_rejects_bad_options(kwargs: dict[str, object]) -> None:
    options: dict[str, object] = {
        "workers": None,
        "ops": ("allreduce",),
        "min_bytes": 1024,
        "max_bytes": 4096,
        "iters": 1,
        "warmup": 0,
        **kwargs,
    }
    workers, ops = options.pop("workers"), options.pop("ops")
    with pytest.raises(UsageError):
        comm_job(workers=workers, ops=ops, sweep=Sweep(**options))  # type: ignore[arg-type]


def test_launch_bench_alternates_sides_and_reports_medians_and_ratio(tmp_path: Path) -> None:
    calls: list[str] = []
    seconds = {
        "dmlctl": iter([9.0, 1.1, 1.3, 1.2, 5.0, 1.2]),
        "torchrun": iter([9.0, 1.0, 1.0, 1.2, 0.9, 1.0]),
    }

    def timer(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> float:
        side = "dmlctl" if "dmlctl" in argv else "torchrun"
        assert env["DMLCTL_HOME"] == str(tmp_path)
        calls.append(side)
        return next(seconds[side])

    quiet = Console(file=io.StringIO())
    report = run_launch_bench(5, 2, console=quiet, home=tmp_path, timer=timer)
    assert calls == ["dmlctl", "torchrun"] * 6  # one untimed warm-up round, then 5
    assert report["dmlctl_s"]["samples"] == [1.1, 1.3, 1.2, 5.0, 1.2]
    assert report["dmlctl_s"]["median"] == 1.2 and report["dmlctl_s"]["max"] == 5.0
    assert report["torchrun_s"]["median"] == 1.0 and report["torchrun_s"]["min"] == 0.9
    assert report["ratio"] == pytest.approx(1.2)
    assert report["overhead_s"] == pytest.approx(0.2)
    out = render(render_launch_table(report))
    ratio_row = next(line for line in out.splitlines() if "dmlctl/torchrun" in line)
    cells = [c.strip() for c in ratio_row.split("│")]
    # the ratio of the medians alone: min/min and max/max bound nothing (4.167 above, or
    # a max below the median, read as a range)
    assert cells == ["dmlctl/torchrun", "1.200", "", ""]
    one = render(render_launch_table({**report, "workers": 1}))
    assert "2 workers" in out and "1 worker," in one


def test_launch_bench_without_the_agent_server_turns_it_off_on_dmlctls_side(
    tmp_path: Path,
) -> None:
    idle: dict[str, set[str | None]] = {"dmlctl": set(), "torchrun": set()}

    def timer(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> float:
        idle["dmlctl" if "dmlctl" in argv else "torchrun"].add(env.get("DMLCTL_AGENT_SERVER_IDLE"))
        return 1.0

    quiet = Console(file=io.StringIO())
    report = run_launch_bench(5, 2, console=quiet, home=tmp_path, timer=timer, server=False)
    assert idle == {"dmlctl": {"0"}, "torchrun": {None}}
    assert report["agent_server"] is False
    assert "no agent server" in " ".join(render(render_launch_table(report)).split())


def test_launch_bench_commands_and_minimum_repeats() -> None:
    assert dmlctl_command(3)[1:] == [
        "-m",
        "dmlctl",
        "launch",
        dmlctl_command(3)[4],
        "--workers",
        "3",
        "--ui",
        "quiet",
    ]
    assert dmlctl_command(3)[4].endswith("trivial/job.yaml")
    assert torchrun_command(3)[1:6] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "3",
    ]
    with pytest.raises(UsageError, match="at least 5"):
        run_launch_bench(4, 2, console=Console(file=io.StringIO()))


def test_a_bench_runs_its_own_job_with_warm_ranks_unless_the_job_names_them(
    tmp_path: Path,
) -> None:
    from dmlctl.bench.recovery_timing import local_cluster
    from dmlctl.bench.runs import launch_bench
    from dmlctl.launch.api import LaunchResult
    from dmlctl.spec.models import JobSpec

    seen: list[str] = []

    def launcher(job: JobSpec, *_: object, **__: object) -> LaunchResult:
        seen.append(job.ranks.start)
        return LaunchResult("r", None, None, 0)

    quiet = Console(file=io.StringIO())
    plain = JobSpec(name="j", script="t.py")
    named = JobSpec.model_validate({"name": "j", "script": "t.py", "ranks": {"start": "fresh"}})
    for job in (plain, named):
        launch_bench(job, local_cluster(2), console=quiet, home=tmp_path, launcher=launcher)
    assert seen == ["warm", "fresh"]
