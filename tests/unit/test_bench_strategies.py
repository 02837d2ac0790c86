"""``dmlctl bench strategies`` without running it: every run it makes is a valid job
file, the ratios come from the right baselines, and every section renders."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dmlctl.bench.strategies import overlap_row, parse_sections, with_ratios, write_job
from dmlctl.bench.strategies_report import render_strategies_table
from dmlctl.bench.strategy_rows import BYTES, FILTERS, OVERLAP, job_spec
from dmlctl.errors import UsageError
from dmlctl.spec import load_job


@pytest.mark.parametrize(
    ("name", "row", "extra"),
    [(n, r, {}) for n, r in {**BYTES, **FILTERS}.items()]
    + [(n, r, {"overlap": True}) for n, r in OVERLAP.items()],
    ids=[f"{n}" for n in {**BYTES, **FILTERS}] + [f"{n} overlap" for n in OVERLAP],
)
def test_every_run_is_a_valid_job(
    tmp_path: Path, name: str, row: Any, extra: dict[str, Any]
) -> None:
    spec = job_spec(name, row, 400)
    spec["strategy"]["params"].update(extra)
    job = load_job(write_job(spec, tmp_path))
    assert job.strategy.name == row.strategy and job.workers == 2
    assert job.parameter_servers == row.servers
    for key, value in {**row.params, **extra}.items():
        assert getattr(job.strategy.params, key) == value


def test_every_baseline_is_a_row_of_its_table() -> None:
    for table in (BYTES, FILTERS):
        for row in table.values():
            assert row.against is None or row.against in table


def test_ratios_are_against_each_rows_baseline() -> None:
    rows: dict[str, dict[str, Any]] = {
        "asgd": {"bytes_per_step": 400.0, "against": None},
        "asgd push int8": {"bytes_per_step": 250.0, "against": "asgd"},
        "bmuf, threshold 0.01": {"bytes_per_step": 10.0, "against": "bmuf"},  # bmuf not run
    }
    out = with_ratios(rows)
    assert out["asgd push int8"]["ratio"] == 0.625
    assert "ratio" not in out["asgd"] and "ratio" not in out["bmuf, threshold 0.01"]


def _run(rate: float, share: float) -> dict[str, float]:
    return {"samples_per_s": rate, "comm_share": share, "comm_bytes_per_step": 100.0}


def test_overlap_ratio_is_the_median_with_over_the_median_without() -> None:
    row = overlap_row(
        {
            "false": [_run(100, 0.5), _run(90, 0.6), _run(110, 0.4)],
            "true": [_run(150, 0.1), _run(120, 0.2), _run(200, 0.1)],
        }
    )
    assert row["ratio"] == 1.5
    assert row["true"]["comm_share"]["median"] == 0.1


def test_sections_are_checked() -> None:
    assert parse_sections("overlap, bytes") == ["bytes", "overlap"]
    with pytest.raises(UsageError, match="unknown speed"):
        parse_sections("bytes,speed")
    with pytest.raises(UsageError, match="empty list"):
        parse_sections(" , ")


def test_every_section_renders_at_80_columns() -> None:
    samples = {"median": 10.0, "min": 9.0, "max": 11.0, "samples": [9.0, 10.0, 11.0]}
    report = {
        "workers": 2,
        "repeats": 3,
        "throughput_ratio": 1.0,
        "throughput_goal": 0.97,
        "dmlctl_samples_per_s": samples,
        "bare_samples_per_s": samples,
        "bytes": with_ratios(
            {
                "ssgd": {"bytes_per_step": 2101248.0, "against": None, "goal": None},
                "ssgd int8": {"bytes_per_step": 525316.0, "against": "ssgd", "goal": 0.26},
            }
        ),
        "filters": with_ratios(
            {
                "asgd": {"bytes_per_step": 4202496.0, "against": None, "goal": None},
                "asgd push threshold 0.01": {"bytes_per_step": 2300000.0, "against": "asgd"},
            }
        ),
        "overlap": {"asgd": overlap_row({"false": [_run(100, 0.5)], "true": [_run(130, 0.1)]})},
    }
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    for table in render_strategies_table(report):
        console.print(table)
    text = out.getvalue()
    assert "2,101,248" in text and "0.2500" in text and "0.5473" in text
    assert "1.300" in text and "asgd push threshold 0.01" in text
    assert max(len(line) for line in text.splitlines()) <= 80
