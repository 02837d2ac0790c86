"""The runtime API in real processes: torchrun + gloo, without the dmlctl launcher.

One 2-rank torchrun run and two single-process runs of ``scripts/runtime_probe.py``
are shared by the assertions (module-scoped fixtures) to keep the file fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from dmlctl.protocol import ENV_RANK_DIR, ENV_STRATEGY, ENV_STRATEGY_PARAMS, rank_events
from dmlctl.runtime.env import read_env
from dmlctl.spec.field_docs import field_docs
from dmlctl.strategies import registry
from dmlctl.strategies.registry import UnknownStrategy
from dmlctl.strategies.ssgd import params as ssgd

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).parent / "scripts" / "runtime_probe.py"
N_SAMPLES = 40  # keep in sync with the probe
TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


def _env(**extra: str) -> dict[str, str]:
    """A clean environment: no inherited rank or dmlctl variables, dmlctl importable."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in TORCHRUN_VARS and not k.startswith("DMLCTL_")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _probes(out: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"probe-{r}.json").read_text()) for r in range(world)]


def _metrics(rank_dir: Path, rank: int) -> list[dict[str, Any]]:
    lines = Path(rank_events(str(rank_dir), rank)).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "metric"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    out = tmp_path_factory.mktemp("two_ranks")
    env = _env(
        **{
            ENV_RANK_DIR: str(out),
            ENV_STRATEGY: "ssgd",
            ENV_STRATEGY_PARAMS: '{"bucket_cap_mb": 1}',
        }
    )
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(PROBE),
        str(out),
    ]
    _run(argv, env)
    return _probes(out, 2), out


@pytest.fixture(scope="module")
def single_with_rank_dir(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Any], Path, str]:
    out = tmp_path_factory.mktemp("single_dir")
    proc = _run([sys.executable, str(PROBE), str(out)], _env(**{ENV_RANK_DIR: str(out)}))
    return _probes(out, 1)[0], out, proc.stdout


@pytest.fixture(scope="module")
def single_plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("single_plain")
    proc = _run([sys.executable, str(PROBE), str(out)], _env())
    return _probes(out, 1)[0], proc.stdout


# ---- two ranks under torchrun ----------------------------------------------------------


@pytest.mark.integration
def test_context_reads_torchrun_env(two_ranks: tuple[list[dict[str, Any]], Path]) -> None:
    probes, _ = two_ranks
    assert [p["rank"] for p in probes] == [0, 1]
    for p in probes:
        assert p["same_context"] is True
        assert (p["world_size"], p["local_world_size"]) == (2, 2)
        assert p["local_rank"] == p["rank"]
        assert (p["role"], p["strategy"], p["device"]) == ("worker", "ssgd", "cpu")
        assert p["params"]["bucket_cap_mb"] == 1.0  # from DMLCTL_STRATEGY_PARAMS
        assert p["is_main"] is (p["rank"] == 0)


@pytest.mark.integration
def test_metric_records_have_increasing_steps_and_floats(
    two_ranks: tuple[list[dict[str, Any]], Path],
) -> None:
    _, rank_dir = two_ranks
    for rank in (0, 1):
        records = _metrics(rank_dir, rank)
        assert [r["step"] for r in records] == [0, 1, 2, 10, 11]
        assert all(r["rank"] == rank for r in records)
        assert all(isinstance(r["values"]["loss"], float) for r in records)
        assert records[0]["values"]["lr"] == 0.1
        # Throughput only where shard() yielded samples since the previous record.
        assert records[0]["values"]["samples_per_s"] > 0
        assert all("samples_per_s" not in r["values"] for r in records[1:])


@pytest.mark.integration
def test_shards_are_disjoint_cover_the_dataset_and_reshuffle(
    two_ranks: tuple[list[dict[str, Any]], Path],
) -> None:
    probes, _ = two_ranks
    for epoch in ("0", "1"):
        parts = [p["shard"][epoch] for p in probes]
        assert [len(part) for part in parts] == [N_SAMPLES // 2] * 2
        assert set(parts[0]).isdisjoint(parts[1])
        assert set(parts[0]) | set(parts[1]) == set(range(N_SAMPLES))
    for p in probes:
        assert p["shard"]["0"] != p["shard"]["1"]
    # A dataset of dicts is collated to a dict of batched tensors, still sharded.
    assert probes[0]["dict_batch_keys"] == ["i", "x"]
    assert sorted(probes[0]["dict_indices"] + probes[1]["dict_indices"]) == list(range(10))


@pytest.mark.integration
def test_ssgd_keeps_replicas_identical(two_ranks: tuple[list[dict[str, Any]], Path]) -> None:
    probes, _ = two_ranks
    for p in probes:
        assert p["wrapped"] == "MeteredDDP"  # DDP subclass that meters its comm hook
        assert p["param_max_diff"] == 0.0
        assert p["params_moved"] > 0.0
        assert p["mean_of_ranks"] == pytest.approx(0.5)
        assert p["mean_of_tensor"] == pytest.approx(1.0)


# ---- one process, no torchrun -----------------------------------------------------------


@pytest.mark.integration
def test_single_process_fallback(single_with_rank_dir: tuple[dict[str, Any], Path, str]) -> None:
    probe, rank_dir, stdout = single_with_rank_dir
    assert (probe["rank"], probe["world_size"], probe["local_world_size"]) == (0, 1, 1)
    assert probe["wrapped"] == "Sequential"  # world 1: the model comes back unchanged
    assert probe["mean_of_ranks"] == 0.0
    for epoch in ("0", "1"):
        assert sorted(probe["shard"][epoch]) == list(range(N_SAMPLES))
    assert probe["shard"]["0"] != probe["shard"]["1"]
    assert [r["step"] for r in _metrics(rank_dir, 0)] == [0, 1, 2, 10, 11]
    assert "step 0" not in stdout  # records go to the file, not to the console


@pytest.mark.integration
def test_plain_run_prints_metrics(single_plain: tuple[dict[str, Any], str]) -> None:
    probe, stdout = single_plain
    assert probe["same_context"] is True
    lines = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 5
    assert lines[0].startswith("step 0 loss=") and "lr=0.1000" in lines[0]
    assert lines[3].startswith("step 10 loss=0.5000")


# ---- unit: cheap, no processes ------------------------------------------------------------


def test_ssgd_params_validate() -> None:
    assert ssgd.Params().bucket_cap_mb == 25.0
    assert ssgd.CAPABILITIES.roles == ("worker",)
    with pytest.raises(ValidationError, match="extra"):
        ssgd.Params.model_validate({"bucket_cap": 10})
    with pytest.raises(ValidationError):
        ssgd.Params(bucket_cap_mb=0)
    params = ssgd.Params()
    with pytest.raises(ValidationError, match="frozen"):
        params.bucket_cap_mb = 1.0
    assert field_docs(ssgd.Params).keys() == ssgd.Params.model_fields.keys()


def test_runtime_and_strategy_imports_do_not_import_torch() -> None:
    code = (
        "import sys, dmlctl, dmlctl.runtime, dmlctl.strategies.ssgd.params as s\n"
        "from dmlctl.strategies import registry\n"
        "registry.load('ssgd').Params.model_validate({'bucket_cap_mb': 5})\n"
        "dmlctl.runtime.__all__\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    proc = _run([sys.executable, "-c", code], _env())
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({ENV_STRATEGY_PARAMS: "{not json"}, "DMLCTL_STRATEGY_PARAMS"),
        ({ENV_STRATEGY_PARAMS: '{"nope": 1}'}, "nope"),
        ({"DMLCTL_ROLE": "server"}, "role 'server'"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "outside"),
        ({"RANK": "x"}, "RANK='x'"),
    ],
)
def test_read_env_rejects_bad_values(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_env(environ, registry.load)


def test_read_env_defaults_and_unknown_strategy() -> None:
    env = read_env({}, registry.load)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (0, 1, 0, 1)
    assert (env.role, env.strategy, env.rank_dir) == ("worker", "ssgd", None)
    assert env.params == ssgd.Params()
    with pytest.raises(UnknownStrategy, match=r"valid: .*ssgd"):
        read_env({ENV_STRATEGY: "nope"}, registry.load)
