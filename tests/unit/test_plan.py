"""dmlctl.plan: spec in, exact per-host argv and env out (data fixtures), JSON round
trip, and the redacted dry-run rendering.

Each directory under ``fixtures/plans`` holds ``cluster.yaml``, ``job.yaml``, the job's
``train.py`` and ``expected.json``: either the plan's ``to_dict()`` or
``{"error": <class name>, "message": <text>}``. The fixture directory's absolute path
is written as ``<FIXTURE>`` so the files are portable. To accept new output after an
intended change, run ``UPDATE_PLAN_FIXTURES=1 pytest tests/unit/test_plan.py`` and
review the diff.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from dmlctl import protocol
from dmlctl.agent_config import AgentConfig, StrategyChoice
from dmlctl.errors import DmlctlError, PlanError, UsageError
from dmlctl.plan.build import build_plan
from dmlctl.plan.model import LaunchPlan
from dmlctl.plan.render import REDACTED, render_plan
from dmlctl.spec import load_cluster, load_job

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "plans"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "job.yaml").is_file())
TOKEN = "<FIXTURE>"
UPDATE = os.environ.get("UPDATE_PLAN_FIXTURES") == "1"

RUN_ID = "run-1"
RDZV_PORT = 29500
LOCAL_PYTHON = "/usr/bin/python3"
LOCAL_RUN_DIR = "/runs/run-1"


def plan_case(case: str) -> LaunchPlan:
    directory = FIXTURES / case
    return build_plan(
        load_cluster(directory / "cluster.yaml"),
        load_job(directory / "job.yaml"),
        run_id=RUN_ID,
        rdzv_port=RDZV_PORT,
        local_python=LOCAL_PYTHON,
        local_run_dir=LOCAL_RUN_DIR,
    )


def portable(value: Any, directory: Path) -> Any:
    """``value`` (JSON data) with every occurrence of ``directory`` written as TOKEN."""
    if isinstance(value, str):
        return value.replace(str(directory), TOKEN)
    if isinstance(value, list):
        return [portable(v, directory) for v in value]
    if isinstance(value, dict):
        return {k: portable(v, directory) for k, v in value.items()}
    return value


def outcome(case: str) -> Any:
    """What the fixture's expected.json describes, computed now."""
    directory = FIXTURES / case
    try:
        plan = plan_case(case)
    except DmlctlError as e:
        error: dict[str, Any] = {"error": type(e).__name__, "message": str(e)}
        if isinstance(e, PlanError):  # the spec key the launcher names with its line
            error["at"] = [e.spec, *e.path]
        return portable(error, directory)
    # Through JSON, as plan.json stores it (tuples become lists).
    return portable(json.loads(json.dumps(plan.to_dict())), directory)


def test_fixture_cases_are_present() -> None:
    # Guards against a glob that silently finds nothing.
    assert len(CASES) >= 6, CASES


@pytest.mark.parametrize("case", CASES)
def test_plan_matches_fixture(case: str) -> None:
    expected_file = FIXTURES / case / "expected.json"
    got = outcome(case)
    if UPDATE:
        expected_file.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    expected = json.loads(expected_file.read_text())
    assert got == expected


# --- properties the fixtures encode, spelled out so a careless UPDATE cannot hide them


def host_env(case: str, host: str = "local") -> dict[str, str]:
    plan = plan_case(case)
    return dict(next(h for h in plan.hosts if h.name == host).env)


def test_default_local_host_runs_two_workers_with_the_controller_python() -> None:
    plan = plan_case("local_two_workers")
    (host,) = plan.hosts
    assert (plan.world_size, host.nproc, host.first_rank, host.node_rank) == (2, 2, 0, 0)
    assert host.is_local and host.python == LOCAL_PYTHON
    assert host.workdir == str(FIXTURES / "local_two_workers")
    assert host.rank_dir == "/runs/run-1/hosts/local"
    assert host.agent_argv == (LOCAL_PYTHON, "-m", "dmlctl.agent", "--run-id", RUN_ID)
    assert plan.rdzv_endpoint == "localhost:29500"
    argv = host.torchrun_argv
    assert argv[:3] == (LOCAL_PYTHON, "-m", "dmlctl.agent.torchrun")
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[argv.index("--nnodes") + 1] == "1"
    assert argv[argv.index("--rdzv-id") + 1] == RUN_ID
    assert argv[-3:] == ("-m", "dmlctl.runtime.entry", "train.py")
    assert [(r.rank, r.host, r.local_rank) for r in plan.ranks] == [
        (0, "local", 0),
        (1, "local", 1),
    ]


def test_fewer_workers_than_slots_uses_only_what_is_asked() -> None:
    plan = plan_case("local_partial_slots")
    (host,) = plan.hosts
    assert (plan.world_size, host.nproc) == (2, 2)
    assert host.torchrun_argv[-5:] == (
        "dmlctl.runtime.entry",
        "train.py",
        "--epochs",
        "3",
        "--lr=0.1",
    )


def test_env_precedence_host_over_job_over_defaults() -> None:
    env = host_env("env_precedence")
    assert env["FROM_DEFAULTS"] == "defaults"
    assert env["FROM_JOB"] == "job"
    assert env["SHARED_DH"] == "host"  # host env is merged over defaults.env
    assert env["SHARED_JH"] == "host"  # ...and over the job env
    assert env["SHARED_ALL"] == "host"
    assert env["OMP_NUM_THREADS"] == "8"  # the host overrides dmlctl's default of 1
    assert env[protocol.ENV_RANK_DIR] == "/runs/run-1/hosts/local"
    assert env[protocol.ENV_RUN_ID] == RUN_ID
    assert env["PYTHONUNBUFFERED"] == "1"


def test_several_workers_per_host_get_one_thread_each_by_default() -> None:
    assert host_env("local_two_workers")["OMP_NUM_THREADS"] == "1"


def test_strategy_params_reach_the_plan_and_every_rank_env() -> None:
    plan = plan_case("strategy_params")
    assert plan.strategy == "ssgd"
    assert plan.params_data() == {"bucket_cap_mb": 50, "find_unused_parameters": True}
    assert plan.strategy_params.model_fields_set == {"bucket_cap_mb", "find_unused_parameters"}
    # Carried once, in the plan, name and parameters together; every host's agent
    # hands both to its ranks.
    assert protocol.ENV_STRATEGY not in plan.hosts[0].env
    assert protocol.ENV_STRATEGY_PARAMS not in plan.hosts[0].env
    for host in plan.hosts:
        config = plan.agent_config(host)
        assert config.strategy == StrategyChoice("ssgd", plan.params_data())
        assert AgentConfig.from_json(config.to_json()) == config
        env = config.rank_env()
        assert env[protocol.ENV_STRATEGY] == "ssgd"
        assert json.loads(env[protocol.ENV_STRATEGY_PARAMS]) == plan.params_data()


def test_multi_host_fills_hosts_in_order() -> None:
    plan = plan_case("multi_host_remote")
    a, b = plan.hosts
    assert [(h.name, h.node_rank, h.nproc, h.first_rank) for h in plan.hosts] == [
        ("node-a", 0, 2, 0),
        ("node-b", 1, 1, 2),
    ]
    assert plan.rdzv_endpoint == "10.0.0.11:29500"
    for host in (a, b):
        assert not host.is_local
        assert host.python == "/opt/venv/bin/python"
        assert host.workdir == "/scratch/dmlctl/multi_host_remote"
        assert host.rank_dir == f"/scratch/dmlctl/.dmlctl/runs/run-1/{host.name}"
        argv = host.torchrun_argv
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.11:29500"
    assert a.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert b.env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert "OMP_NUM_THREADS" not in b.env  # one worker: torchrun's default does not apply
    assert [(r.rank, r.host, r.local_rank) for r in plan.ranks] == [
        (0, "node-a", 0),
        (1, "node-a", 1),
        (2, "node-b", 0),
    ]


def test_hosts_without_workers_are_left_out() -> None:
    plan = plan_case("unused_host_dropped")
    assert [h.name for h in plan.hosts] == ["local"]
    argv = plan.hosts[0].torchrun_argv
    assert argv[argv.index("--nnodes") + 1] == "1"


def test_more_workers_than_slots_is_a_usage_error_naming_the_slots() -> None:
    with pytest.raises(UsageError) as info:
        plan_case("too_many_workers")
    message = str(info.value)
    assert "5 workers" in message
    assert "3 slots" in message
    assert "a: 2" in message and "b: 1" in message


# --- JSON round trip


@pytest.mark.parametrize("case", ["multi_host_remote", "strategy_params", "env_precedence"])
def test_plan_round_trips_through_json(case: str) -> None:
    plan = plan_case(case)
    again = LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    assert isinstance(again.hosts[0].torchrun_argv, tuple)
    assert again.to_dict() == plan.to_dict()


# --- dry-run rendering


def test_render_redacts_secret_looking_env_keys() -> None:
    plan = plan_case("env_precedence")
    host = plan.hosts[0]
    secrets = {"API_TOKEN": "tok-123", "DB_PASSWORD": "hunter2", "AWS_SECRET_ACCESS_KEY": "xyz"}
    plan = dataclasses.replace(
        plan, hosts=(dataclasses.replace(host, env={**host.env, **secrets}),)
    )
    text = render_plan(plan)
    for key, value in secrets.items():
        assert value not in text
        assert f"{key}={REDACTED}" in text
    assert "s3cr3t-token" not in text  # the job's own API_TOKEN
    assert "FROM_JOB=job" in text  # ordinary values are shown


def test_render_shows_every_hosts_torchrun_command() -> None:
    plan = plan_case("multi_host_remote")
    text = render_plan(plan)
    for host in plan.hosts:
        assert f"torchrun: {shlex.join(host.torchrun_argv)}" in text
        assert f"agent:    {shlex.join(host.agent_argv)}" in text
    assert "host node-a — 10.0.0.11 over SSH, node rank 0, ranks 0-1" in text
    assert "host node-b — 10.0.0.12 over SSH, node rank 1, ranks 2-2" in text
    assert "rendezvous: c10d at 10.0.0.11:29500" in text
    assert "3 workers on 2 hosts" in text


def test_render_shows_strategy_params() -> None:
    text = render_plan(plan_case("strategy_params"))
    assert "strategy params: bucket_cap_mb=50, find_unused_parameters=True" in text
