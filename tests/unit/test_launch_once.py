"""``launch`` places and plans a job once: every plan-time refusal (file:line) before
any host is touched, the rendezvous port picked on the first placed host, the doctor
run on the cluster's hosts with that port, then one plan (no hosts: fakes).

Also the other end of the plan: what a host agent gives torchrun from its typed
configuration."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from dmlctl import protocol
from dmlctl.agent.start import environment
from dmlctl.errors import SpecError
from dmlctl.launch import api, schedulers
from dmlctl.launch.api import LaunchOptions, LaunchResult
from dmlctl.plan import request
from dmlctl.plan.model import LaunchPlan
from dmlctl.provision import doctor, ship
from dmlctl.spec import load_cluster, load_job, local

CLUSTER = """\
hosts:
  - {name: a, address: 10.0.0.1, slots: 2, python: /py}
  - {name: b, address: 10.0.0.2, slots: 2, python: /py}
  - {name: c, address: 10.0.0.3, slots: 2, python: /py}
"""


def specs(tmp_path: Path, job: str) -> tuple[Path, Path]:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.yaml").write_text(job)
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    return tmp_path / "job.yaml", tmp_path / "cluster.yaml"


def counted(calls: list[str], name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real(*args, **kwargs)

    return call


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    placing = counted(seen, "place", api.place_job)
    monkeypatch.setattr(api, "place_job", placing)
    monkeypatch.setattr(request, "place_job", placing)
    monkeypatch.setattr(request, "build_plan", counted(seen, "plan", request.build_plan))
    return seen


def launch(job_file: Path, cluster_file: Path, tmp_path: Path, **kw: Any) -> LaunchResult:
    options = LaunchOptions(
        home=tmp_path / "home", job_file=job_file, cluster_file=cluster_file, **kw
    )
    return api.launch(
        load_job(job_file),
        load_cluster(cluster_file),
        options=options,
        console=Console(file=io.StringIO()),
    )


def no_host(*_args: Any, **_kw: Any) -> Any:
    raise AssertionError("a host was touched")


def test_a_dry_run_places_and_plans_once_and_touches_no_host(
    tmp_path: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def resolve_only(hosts: Any, *_args: Any) -> dict[str, Any]:
        """Transports as ~/.ssh/config resolves them; any use of one fails."""
        return {
            h.name: SimpleNamespace(hostname=h.address, route=f"u@{h.address}:22", run=no_host)
            for h in hosts
        }

    monkeypatch.setattr(schedulers, "make_transports", resolve_only)
    job_file, cluster_file = specs(tmp_path, "script: train.py\nworkers: 3\n")
    assert launch(job_file, cluster_file, tmp_path, dry_run=True).exit_code == 0
    assert calls == ["place", "plan"]


def test_a_plan_time_refusal_names_the_line_before_any_host_is_touched(
    tmp_path: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedulers, "make_transports", no_host)
    job_file, cluster_file = specs(tmp_path, "script: train.py\nworkers: 9\n")
    with pytest.raises(SpecError, match=f"{job_file}:2 workers: the job asks for 9 workers"):
        launch(job_file, cluster_file, tmp_path)
    assert calls == ["place"]


def test_a_remote_launch_plans_once_on_the_port_of_the_first_placed_host(
    tmp_path: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def doctor_run(hosts: list[Any], _transports: object, rdzv_port: int, **_kw: Any) -> Any:
        seen["doctor"] = ([h.name for h in hosts], rdzv_port)
        return SimpleNamespace(ok=True, hosts=())

    def start(plan: LaunchPlan, *_args: object) -> LaunchResult:
        seen["plan"] = plan
        return LaunchResult(plan.run_id, None, None, 0)

    def pick_port(transport: str, _python: str, _timeout: float) -> int:
        seen["port_on"] = transport
        return 4242

    monkeypatch.setattr(
        schedulers, "make_transports", lambda hosts, _o: {h.name: h.name for h in hosts}
    )
    monkeypatch.setattr(schedulers, "network_address", lambda _t, address: address)
    monkeypatch.setattr(schedulers, "pick_port", pick_port)
    monkeypatch.setattr(schedulers, "start_run", start)
    monkeypatch.setattr(doctor, "run_doctor", doctor_run)
    for name in ("sync_code", "run_setup"):
        monkeypatch.setattr(ship, name, lambda *_a: None)
    job_file, cluster_file = specs(tmp_path, "script: train.py\nworkers: 3\n")
    launch(job_file, cluster_file, tmp_path)
    assert calls == ["place", "plan"]
    assert seen["port_on"] == "a" and seen["doctor"] == (["a", "b", "c"], 4242)
    plan: LaunchPlan = seen["plan"]
    assert plan.rdzv_endpoint == "10.0.0.1:4242"
    assert [h.name for h in plan.hosts] == ["a", "b"] and [h.name for h in plan.spares] == ["c"]


def test_the_agent_gives_torchrun_the_plans_env_attempt_and_strategy_params(
    tmp_path: Path,
) -> None:
    job = "script: train.py\nworkers: 2\nstrategy: {name: ssgd, params: {bucket_cap_mb: 5}}\n"
    job_file, cluster_file = specs(tmp_path, job)
    plan = api.plan_run(
        load_job(job_file), load_cluster(cluster_file), api.RunStore(tmp_path / "home"), port=1
    )
    config = plan.agent_config(plan.hosts[0], attempt=1, stop_grace=2.5)
    env = environment(config, "/expanded/rank-dir")
    assert {k: env[k] for k in plan.hosts[0].env if k != protocol.ENV_RANK_DIR} == {
        k: v for k, v in plan.hosts[0].env.items() if k != protocol.ENV_RANK_DIR
    }
    assert json.loads(env[protocol.ENV_STRATEGY_PARAMS]) == {"bucket_cap_mb": 5}
    assert (env[protocol.ENV_ATTEMPT], env[protocol.ENV_RANK_DIR]) == ("2", "/expanded/rank-dir")
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "3"
    here = os.path.dirname(os.path.dirname(os.path.abspath(protocol.__file__)))
    assert env["PYTHONPATH"].split(os.pathsep)[0] == here


def probed(gpus: int) -> Callable[..., Any]:
    """A doctor whose every host passed with ``gpus`` GPUs."""

    def run(hosts: list[Any], _transports: object, rdzv_port: int, **_kw: Any) -> Any:
        del rdzv_port
        reports = tuple(SimpleNamespace(host=h.name, facts={"gpus": gpus}) for h in hosts)
        return SimpleNamespace(ok=True, hosts=reports)

    return run


def remote_up_to_the_plan(monkeypatch: pytest.MonkeyPatch, gpus: int) -> list[str]:
    """Fakes for every step of a remote launch before the plan (the doctor reporting
    ``gpus`` GPUs per host); returns the steps taken after the doctor."""
    after: list[str] = []
    monkeypatch.setattr(
        schedulers, "make_transports", lambda hosts, _o: {h.name: h.name for h in hosts}
    )
    monkeypatch.setattr(schedulers, "network_address", lambda _t, address: address)
    monkeypatch.setattr(schedulers, "pick_port", lambda *_a: 4242)
    monkeypatch.setattr(doctor, "run_doctor", probed(gpus))
    monkeypatch.setattr(
        schedulers, "start_run", lambda plan, *_a: LaunchResult(plan.run_id, None, None, 0)
    )
    for name in ("sync_code", "run_setup"):
        monkeypatch.setattr(ship, name, lambda *_a, _n=name: after.append(_n))
    return after


def test_more_workers_than_a_hosts_gpus_is_refused_after_the_preflight_before_any_code_moves(
    tmp_path: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    after = remote_up_to_the_plan(monkeypatch, gpus=1)
    job_file, cluster_file = specs(tmp_path, "script: train.py\nworkers: 3\n")
    with pytest.raises(
        SpecError,
        match=f"{job_file}:2 workers: host 'a': 2 workers on 1 GPU: NCCL cannot put two ranks "
        "on one GPU; lower workers to 1, or set backend: gloo",
    ):
        launch(job_file, cluster_file, tmp_path)
    assert calls == ["place"] and after == []


def test_workers_share_a_hosts_gpus_under_gloo_and_a_cpu_host_takes_any_number(
    tmp_path: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    after = remote_up_to_the_plan(monkeypatch, gpus=1)
    job_file, cluster_file = specs(tmp_path, "script: train.py\nworkers: 3\nbackend: gloo\n")
    launch(job_file, cluster_file, tmp_path)
    assert calls == ["place", "plan"] and after == ["sync_code", "run_setup"]
    remote_up_to_the_plan(monkeypatch, gpus=0)
    launch(*specs(tmp_path, "script: train.py\nworkers: 3\n"), tmp_path)


def on_this_machine(tmp_path: Path) -> tuple[Path, Path]:
    """Where a job file goes (``job.yaml``, beside an empty ``train.py``) and a cluster
    of one host on this machine, 2 slots."""
    (tmp_path / "train.py").write_text("")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("hosts:\n  - {name: here, address: localhost, slots: 2}\n")
    return tmp_path / "job.yaml", cluster


def test_on_this_machine_more_workers_than_gpus_is_refused_at_plan_time_naming_the_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "count_local_gpus", lambda env: 1)
    job, cluster = on_this_machine(tmp_path)
    job.write_text("script: train.py\nworkers: 2\nbackend: nccl\n")
    with pytest.raises(SpecError, match=f"{job}:3 backend: host 'here': 2 workers on 1 GPU"):
        launch(job, cluster, tmp_path, dry_run=True)
    job.write_text("script: train.py\nworkers: 2\nstrategy: hogwild\n")  # trains on the CPU
    assert launch(job, cluster, tmp_path, dry_run=True).exit_code == 0


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_an_nccl_backend_on_a_machine_without_a_gpu_is_refused_at_plan_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Also the dry run: NCCL would fail in every rank at its start."""
    monkeypatch.setattr(local, "count_local_gpus", lambda env: 0)
    job, cluster = on_this_machine(tmp_path)
    job.write_text(f"script: train.py\nworkers: 2\nbackend: '{backend}'\n")
    said = f"{job}:3 backend: host 'here': backend '{backend}' needs CUDA, and this host has no GPU"
    for dry_run in (True, False):
        with pytest.raises(SpecError, match=re.escape(said)):
            launch(job, cluster, tmp_path, dry_run=dry_run)
    job.write_text("script: train.py\nworkers: 2\nbackend: gloo\n")
    assert launch(job, cluster, tmp_path, dry_run=True).exit_code == 0


@pytest.mark.parametrize(
    ("directory", "said"),
    [
        ("afile", "{tmp}/afile is a file, not a directory"),
        ("afile/{run_id}", "{tmp}/afile is a file, not a directory"),
        ("afile/sub", "{tmp}/afile is a file, not a directory"),
        ("../../../../../../../../etc/x", "/etc/x is under /etc: the system keeps its files"),
    ],
)
def test_a_checkpoint_dir_this_machine_cannot_hold_is_refused_at_plan_time(
    tmp_path: Path, directory: str, said: str
) -> None:
    """A file where the directory must be failed the run after it trained; a relative
    path is taken under the job's directory, where the ranks run."""
    job, cluster = on_this_machine(tmp_path)
    (tmp_path / "afile").write_text("")
    job.write_text(f"script: train.py\nworkers: 1\ncheckpoint:\n  dir: '{directory}'\n")
    with pytest.raises(
        SpecError,
        match=re.escape(f"{job}:4 checkpoint.dir: ") + re.escape(said.format(tmp=tmp_path)),
    ):
        launch(job, cluster, tmp_path, dry_run=True)


def test_a_remote_host_without_a_gpu_refuses_nccl_after_the_preflight(
    tmp_path: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    after = remote_up_to_the_plan(monkeypatch, gpus=0)
    job_file, cluster_file = specs(tmp_path, "script: train.py\nworkers: 2\nbackend: nccl\n")
    with pytest.raises(SpecError, match="backend 'nccl' needs CUDA"):
        launch(job_file, cluster_file, tmp_path)
    assert after == []


def test_a_gpu_hosts_unset_slots_become_its_gpu_count_after_the_preflight(
    tmp_path: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, LaunchPlan] = {}

    def start(plan: LaunchPlan, *_args: object) -> LaunchResult:
        seen["plan"] = plan
        return LaunchResult(plan.run_id, None, None, 0)

    remote_up_to_the_plan(monkeypatch, gpus=4)
    monkeypatch.setattr(schedulers, "start_run", start)
    job_file, cluster_file = specs(tmp_path, "script: train.py\n")  # workers: auto
    cluster_file.write_text(
        "hosts:\n  - {name: a, address: 10.0.0.1, python: /py}\n"
        "  - {name: b, address: 10.0.0.2, python: /py, slots: 1}\n"
    )
    launch(job_file, cluster_file, tmp_path)
    plan = seen["plan"]
    assert [(h.name, h.slots, h.nproc) for h in plan.hosts] == [("a", 4, 4), ("b", 1, 1)]
    assert calls == ["place", "place", "plan"]  # placed again with a's 4 GPUs
