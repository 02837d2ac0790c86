"""The dry run is the request: one pure function makes it from the facts a scheduler
gathered, ``--dry-run`` prints it, and a launch hands exactly it to the scheduler.
A recorded run is described, cancelled and its logs fetched through the scheduler of
its plan (no hosts: a fake scheduler through the interface, real run directories)."""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console

from dmlctl.launch import api, pick, schedulers
from dmlctl.launch.options import LaunchOptions, LaunchResult
from dmlctl.launch.start import create_run
from dmlctl.plan.placing import JobPlacement, place_job
from dmlctl.plan.request import Facts, LaunchRequest, make_request, render_request
from dmlctl.runs.store import RunDir, RunStore
from dmlctl.spec import load_cluster, load_job
from dmlctl.spec.models import ClusterSpec, JobSpec

REMOTE = """\
hosts:
  - {name: a, address: 10.0.0.1, python: /py}
  - {name: b, address: 10.0.0.2, python: /py, slots: 1}
"""
JOB = "script: train.py\nworkers: auto\nsetup: pip install -r requirements.txt\n"


def specs(tmp_path: Path, cluster: str = REMOTE, job: str = JOB) -> tuple[JobSpec, ClusterSpec]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.yaml").write_text(job)
    (tmp_path / "cluster.yaml").write_text(cluster)
    return load_job(tmp_path / "job.yaml"), load_cluster(tmp_path / "cluster.yaml")


FACTS = Facts(4242, "/py", "10.0.0.1", {"a": 4, "b": 0}, "0.1.0-abc", {"a": "u@10.0.0.1:22"})


@dataclass
class FakeScheduler:
    """Gathers fixed facts; records the request it is asked to carry out."""

    facts: Facts
    name: str = "fake"
    scheduled: list[LaunchRequest] = field(default_factory=list)
    released: int = 0

    def gather(self, job: JobSpec, cluster: ClusterSpec, placement: JobPlacement) -> Facts:
        return self.facts

    def schedule(
        self, request: LaunchRequest, job: JobSpec, cluster: ClusterSpec, store: RunStore
    ) -> LaunchResult:
        self.scheduled.append(request)
        return LaunchResult(request.plan.run_id, None, None, 0)

    def describe(self, run: RunDir) -> list[str]:
        return []

    def cancel(self, run: RunDir, *, timeout: float) -> str:
        return ""

    def logs(self, run: RunDir) -> list[str]:
        return []

    def release(self) -> None:
        self.released += 1


def launched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeScheduler, *, dry: bool
) -> str:
    job, cluster = specs(tmp_path)
    monkeypatch.setattr(api, "scheduler_for", lambda *_a: fake)
    monkeypatch.setattr(api, "new_run_id", lambda *_a: "job-1")
    out = io.StringIO()
    options = LaunchOptions(home=tmp_path / "home", dry_run=dry)
    api.launch(job, cluster, options=options, console=Console(file=out, width=400))
    return out.getvalue()


def test_a_launch_carries_out_exactly_the_request_its_dry_run_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeScheduler(FACTS)
    printed = launched(tmp_path, monkeypatch, fake, dry=True)
    assert fake.scheduled == []
    launched(tmp_path, monkeypatch, fake, dry=False)
    (request,) = fake.scheduled
    assert printed.rstrip("\n") == render_request(request)
    # What the facts decided is in the request: a's 4 GPUs are its slots, the port,
    # the code id, the steps before the start.
    assert [(h.name, h.nproc) for h in request.plan.hosts] == [("a", 4), ("b", 1)]
    assert request.plan.rdzv_endpoint == "10.0.0.1:4242"
    assert request.ship == ("a", "b") and request.setup == "pip install -r requirements.txt"
    assert "sync the job directory and dmlctl 0.1.0-abc to 2 hosts (a, b)" in printed
    assert "slots from the hosts' GPU counts (a: 4)" in printed
    assert "sh -c 'pip install -r requirements.txt'" in printed


def test_the_request_is_a_pure_function_of_its_inputs(tmp_path: Path) -> None:
    job, cluster = specs(tmp_path)
    placement = place_job(cluster, job)

    def made() -> LaunchRequest:
        return make_request(job, cluster, placement, FACTS, run_id="r", run_dir="/runs/r")

    assert made() == made()
    assert render_request(made()) == render_request(made())


def test_a_refused_request_releases_what_the_scheduler_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dmlctl.errors import SpecError

    fake = FakeScheduler(Facts(4242, "/py", "10.0.0.1", {"a": 1, "b": 1}))
    two = REMOTE.replace("10.0.0.1, python: /py}", "10.0.0.1, python: /py, slots: 2}")
    job, cluster = specs(tmp_path, two, "script: train.py\nworkers: 3\nbackend: nccl\n")
    monkeypatch.setattr(api, "scheduler_for", lambda *_a: fake)
    options = LaunchOptions(home=tmp_path / "home", job_file=tmp_path / "job.yaml")
    with pytest.raises(SpecError, match=r"job.yaml:3 backend: host 'a': 2 workers on 1 GPU"):
        api.launch(job, cluster, options=options, console=Console(file=io.StringIO()))
    assert fake.released == 1 and fake.scheduled == []


def test_a_remote_dry_run_says_what_it_assumed(tmp_path: Path) -> None:
    job, cluster = specs(tmp_path)
    out = io.StringIO()
    options = LaunchOptions(home=tmp_path / "home", dry_run=True)
    api.launch(job, cluster, options=options, console=Console(file=out, width=400))
    text = out.getvalue()
    assert "the run's store, held by this controller" in text  # where the hosts meet
    assert "assumed (a dry run connects to nothing):" in text
    assert "slots of a as the cluster file leaves them" in text
    assert not (tmp_path / "home" / "runs").exists() or not any(
        (tmp_path / "home" / "runs").iterdir()
    )


def recorded(tmp_path: Path, cluster: str) -> RunDir:
    job, spec = specs(tmp_path, cluster, "script: train.py\nworkers: 2\n")
    store = RunStore(tmp_path / "home")
    plan = api.plan_run(job, spec, store, port=29500, run_id="job-1")
    return create_run(plan, job, spec, store, LaunchOptions(home=tmp_path / "home"))


def test_a_recorded_run_is_described_by_the_scheduler_of_its_plan(tmp_path: Path) -> None:
    local = recorded(tmp_path / "l", "hosts:\n  - {name: here, address: localhost, slots: 2}\n")
    assert isinstance(pick.scheduler_of(local), schedulers.LocalScheduler)
    assert pick.scheduler_of(local).describe(local) == ["where: this machine (no SSH)"]
    remote = recorded(tmp_path / "r", REMOTE.replace("python: /py}", "python: /py, slots: 1}"))
    scheduler = pick.scheduler_of(remote)
    assert isinstance(scheduler, schedulers.SshScheduler)
    assert scheduler.describe(remote) == [
        "where: 2 hosts over SSH",
        "  a: 10.0.0.1",
        "  b: 10.0.0.2",
    ]
    # A stop of a run whose controller is gone marks it stopped, through the scheduler.
    assert "controller was gone" in scheduler.cancel(remote, timeout=1)


def test_a_run_whose_plan_cannot_be_read_can_still_be_stopped(tmp_path: Path) -> None:
    run = recorded(tmp_path, "hosts:\n  - {name: here, address: localhost, slots: 2}\n")
    run.plan.write_text("{")
    scheduler = pick.scheduler_of(run)
    assert scheduler.describe(run)[0].startswith("where: unknown (")
    assert "controller was gone" in scheduler.cancel(run, timeout=1)


def test_a_dry_run_hides_secrets_in_the_setup_command_too(tmp_path: Path) -> None:
    setup = (
        "export GITHUB_TOKEN=plain-exported-1 && curl -H 'Authorization: Bearer bearer-tok-2' "
        "https://example.com/x && pip install --extra-index-url "
        "https://u:pw-in-url@example.com/simple x"
    )
    env = "env:\n  HF_TOKEN: hf_supersecret123\n"
    job = f'script: train.py\n{env}setup: "{setup} hf_supersecret123"\n'
    job_spec, cluster = specs(tmp_path, job=job)
    out = io.StringIO()
    options = LaunchOptions(home=tmp_path / "home", dry_run=True)
    api.launch(job_spec, cluster, options=options, console=Console(file=out, width=400))
    text = out.getvalue()
    assert "run setup on each of them: sh -c" in text and "HF_TOKEN=***" in text
    assert "hf_supersecret123" not in text and "pw-in-url" not in text
    assert "plain-exported-1" not in text and "bearer-tok-2" not in text
    # the rest of the command stays readable, after every hidden value
    assert "export GITHUB_TOKEN=*** && curl -H" in text and "Bearer ***" in text
    assert "https://example.com/x && pip install --extra-index-url" in text


def test_a_setup_stored_redacted_is_run_whole_on_the_nodes_of_a_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's ``specs/job.yaml`` hides the setup's URL password and known secrets;
    the real command stays in ``secrets.json`` (0600), and the new nodes of a Slurm
    requeue run that one, not the redacted copy. A setup with nothing to hide is not
    kept twice."""
    from dmlctl.launch.reprovision import preparer
    from dmlctl.provision import ship

    setup = "pip install --extra-index-url https://u:pw-in-url@example.com/simple x"
    job, spec = specs(tmp_path, job=f"script: train.py\nworkers: 2\nsetup: {setup}\n")
    store = RunStore(tmp_path / "home")
    plan = api.plan_run(job, spec, store, port=29500, run_id="job-1")
    run = create_run(plan, job, spec, store, LaunchOptions(home=tmp_path / "home"))
    assert "pw-in-url" not in (run.specs / "job.yaml").read_text()
    assert "pw-in-url" not in run.plan.read_text() and run.real_setup() == setup
    ran: list[str | None] = []
    monkeypatch.setattr(ship, "sync_code", lambda *_a: None)
    monkeypatch.setattr(ship, "run_setup", lambda _plan, job, *_a: ran.append(job.setup))
    preparer(run, {})(plan)
    assert ran == [setup]
    plain = recorded(tmp_path / "plain", REMOTE)
    assert plain.real_setup() is None


def test_the_slots_a_launch_takes_from_gpu_counts_are_said_before_a_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dmlctl.errors import DmlctlError

    fake = FakeScheduler(dataclasses.replace(FACTS, gpus={"a": 2, "b": 0}))
    job = "script: train.py\nworkers: auto\nparallelism: {tensor_parallel_degree: 2}\n"
    job_spec, cluster = specs(tmp_path, job=job)
    monkeypatch.setattr(api, "scheduler_for", lambda *_a: fake)
    with pytest.raises(DmlctlError, match="does not divide the number of workers \\(3\\)"):
        api.launch(
            job_spec,
            cluster,
            options=LaunchOptions(home=tmp_path / "h"),
            console=Console(file=io.StringIO()),
        )
    assert "slots from the hosts' GPU counts (a: 2)" in capsys.readouterr().err
    assert fake.released == 1
