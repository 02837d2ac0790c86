"""A rank under dmlctl sees torchrun's world: the same script under bare torchrun and
under ``dmlctl launch``, first attempt and after a restart, compared key by key.

Only ``DMLCTL_*`` and :data:`VALUES_DIFFER` may differ (README, "What a rank sees").
With ``ranks: {start: warm}`` the environment is the same too, and torch is imported
before the script (the documented difference of a warm start).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli

pytestmark = [pytest.mark.integration, pytest.mark.compat]
WORLD = Path(__file__).parent / "jobs" / "world"
VALUES_DIFFER = {
    "MASTER_ADDR": "the address the preflight checked (--local-addr), not torch's guess",
    "MASTER_PORT": "a port of the run's own",
    "TORCHELASTIC_RUN_ID": "the run's id (the same in every attempt)",
    "TORCHELASTIC_ERROR_FILE": "in the run's directory",
    # True under every torch: the ranks join the run's store (the controller's) as
    # clients; bare torchrun on torch 2.4 says False (rank 0 serves a store of its own)
    "TORCHELASTIC_USE_AGENT_STORE": "the ranks join the run's store, the controller's",
}
"""Variables a rank has under both, with other values (README, "What a rank sees")."""
DMLCTL_ONLY = {
    "PYTHONPATH": "dmlctl's own directory comes first (the ranks import the same dmlctl)",
    "PYTHONUNBUFFERED": "every rank's output reaches its log as it is written",
    "TORCH_FR_BUFFER_SIZE": "torch's flight recorder on: a hang's culprit is found from it",
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "the job's restart.stop_grace",
}
"""Variables only dmlctl gives a rank, besides ``DMLCTL_*``."""
WARM_ONLY = {
    "TORCHINDUCTOR_CACHE_DIR": "set by torch's import, done in the zygote before the script",
}
"""Variables only a warm rank has."""


def _world(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """(rank, restart count) → what the rank wrote."""
    seen = {}
    for path in out.glob("world-*.json"):
        _, rank, restart = path.stem.split("-")
        seen[(int(rank), int(restart))] = json.loads(path.read_text())
    return seen


def _bare_torchrun(cli: Cli, job: Path, out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--max-restarts", "1"]
    proc = subprocess.run(
        [*argv, "world.py", str(out), "--fail-first"],
        cwd=job,
        env=cli.env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _world(out)


def _dmlctl(cli: Cli, job: Path, out: Path, mode: str) -> dict[tuple[int, int], dict[str, Any]]:
    """The worlds under ``dmlctl launch``: a job file without ``ranks:`` (fresh is the
    default) and, for ``warm``, the ``--ranks warm`` flag."""
    (job / "job.yaml").write_text(
        "script: world.py\nworkers: 2\n"
        f"args: [{json.dumps(str(out))}, --fail-first]\n"
        "restart: {max_user_restarts: 1, max_infra_restarts: 0, backoff_initial: 0.1}\n"
    )
    proc = cli.run("launch", str(job / "job.yaml"), "--ui", "quiet", "--ranks", mode, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return _world(out)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The script's worlds under bare torchrun, dmlctl (fresh) and dmlctl (warm)."""
    root = tmp_path_factory.mktemp("world")
    cli = Cli(root / "home")
    seen: dict[str, Any] = {}
    for name in ("bare", "fresh", "warm"):
        job, out = root / name, root / f"{name}-out"
        shutil.copytree(WORLD, job, ignore=shutil.ignore_patterns("__pycache__"))
        out.mkdir()
        if name == "bare":
            seen[name] = _bare_torchrun(cli, job, out)
        else:
            seen[name] = _dmlctl(cli, job, out, name)
    return seen


def _differences(
    bare: dict[str, str], ours: dict[str, str], warm: bool
) -> dict[str, tuple[Any, Any]]:
    keys = {*bare, *ours} - (set(WARM_ONLY) - set(bare) if warm else set())
    return {
        k: (bare.get(k), ours.get(k))
        for k in sorted(keys)
        if not k.startswith("DMLCTL_")
        and not (k in DMLCTL_ONLY and k not in bare)
        and bare.get(k) != ours.get(k)
        and not (k in VALUES_DIFFER and k in bare and k in ours)
    }


@pytest.mark.parametrize("mode", ["fresh", "warm"])
def test_each_rank_has_torchruns_environment_in_every_attempt(
    worlds: dict[str, Any], mode: str
) -> None:
    bare, ours = worlds["bare"], worlds[mode]
    assert set(bare) == set(ours) == {(0, 0), (1, 0), (0, 1), (1, 1)}
    for key, theirs in bare.items():
        mine = ours[key]
        assert _differences(theirs["env"], mine["env"], mode == "warm") == {}, key
        assert mine["env"]["TORCHELASTIC_RESTART_COUNT"] == str(key[1])
        assert mine["env"]["TORCHELASTIC_MAX_RESTARTS"] == "1"
        for name in DMLCTL_ONLY:
            assert name in mine["env"], name
    run_ids = {world["env"]["TORCHELASTIC_RUN_ID"] for world in ours.values()}
    assert len(run_ids) == 1, "the run's id changed between attempts"


def test_a_rank_is_a_process_monitoring_finds_the_torchrun_way(worlds: dict[str, Any]) -> None:
    """``RANK`` and the rest in ``/proc/PID/environ``, the script on the command line
    (a warm rank's ``/proc/PID/environ`` is the zygote's: documented)."""
    for mode in ("fresh", "warm"):
        for world in worlds[mode].values():
            proc_env = set(world["proc_env"])
            assert ({"RANK", "LOCAL_RANK", "WORLD_SIZE"} <= proc_env) == (mode == "fresh")
            assert world["cmdline"][1:] == ["-u", *world["argv"]]
            assert world["argv"][0] == "world.py"


def test_a_fresh_rank_imports_torch_itself_as_under_torchrun(worlds: dict[str, Any]) -> None:
    """A script that sets OMP_NUM_THREADS before importing torch gets what it asked for;
    a warm rank (documented) has torch imported before the script, with torchrun's
    OMP_NUM_THREADS (1 for several ranks on a host)."""
    for world in [*worlds["bare"].values(), *worlds["fresh"].values()]:
        assert (world["preimported"], world["threads"]) == (False, 2)
    for world in worlds["warm"].values():
        assert (world["preimported"], world["threads"]) == (True, 1)
