"""A launch inside a Slurm allocation (an sbatch script, an salloc shell) runs on that
allocation's nodes: nothing is asked for, requeue is refused at its key, too few nodes
are refused at ``slurm.nodes``, and the end of the run leaves the allocation to its
owner (only dmlctl's own steps are cancelled). Slurm's commands are scripted."""

from __future__ import annotations

import dataclasses
import io
import os
import time
from pathlib import Path

import pytest
from rich.console import Console

from dmlctl.errors import PlanError
from dmlctl.launch import slurm_scheduler
from dmlctl.runs.store import RunStore
from dmlctl.slurm import allocation, enclosing, steps
from dmlctl.slurm.allocation import Allocation, Granted, JobState
from dmlctl.spec.slurm import SlurmSpec
from tests.unit.test_supervisor import make_plan

NODES = ["lab-4", "lab-5", "lab-6"]
ADDRESSES = {"lab-4": "10.0.0.4", "lab-5": "10.0.0.5", "lab-6": "10.0.0.6"}


@pytest.fixture
def inside(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """This process inside Slurm job 77 (3 nodes, running); the sbatch requests made."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setattr(enclosing, "state", lambda job, conf: JobState("RUNNING", "", "lab-[4-6]"))
    monkeypatch.setattr(enclosing, "hostnames", lambda nodelist, conf: list(NODES))
    monkeypatch.setattr(enclosing, "node_addresses", lambda nodes, conf: dict(ADDRESSES))
    asked: list[list[str]] = []

    def allocate(argv: list[str], *_a: object, **_k: object) -> Granted:
        asked.append(argv)
        return Granted("78", NODES[:2], ADDRESSES)

    monkeypatch.setattr(allocation, "allocate", allocate)
    return asked


def ask(spec: SlurmSpec, hosts: int = 2) -> tuple[Allocation, dict[str, str], str]:
    out = io.StringIO()
    names = [f"node-{i}" for i in range(hosts)]
    where, addresses = slurm_scheduler.ask(spec, "j", names, 1, Console(file=out, width=200))
    return where, addresses, out.getvalue()


def test_the_enclosing_allocations_first_nodes_are_the_runs(inside: list[list[str]]) -> None:
    where, addresses, said = ask(SlurmSpec(nodes=2, partition="ignored", warn_before_end=30))
    assert inside == []  # nothing asked for
    assert (where.job_id, dict(where.nodes)) == ("77", {"node-0": "lab-4", "node-1": "lab-5"})
    assert not where.owned and not where.requeue and where.sbatch == () and where.warn_s == 30
    assert addresses["lab-5"] == "10.0.0.5"
    assert "Slurm job 77 (dmlctl runs inside it): 2 nodes (lab-4, lab-5)" in said
    ranged, _, _ = ask(SlurmSpec(nodes="2-5"), hosts=5)  # a range: as many as it has
    assert list(ranged.nodes.values()) == NODES


def test_new_asks_for_an_allocation_even_inside_one(inside: list[list[str]]) -> None:
    where, _, _ = ask(SlurmSpec(nodes=2, allocation="new"))
    assert where.job_id == "78" and where.owned and len(inside) == 1
    del os.environ["SLURM_JOB_ID"]  # outside any allocation: asked for too
    assert ask(SlurmSpec(nodes=2))[0].job_id == "78" and len(inside) == 2


def test_requeue_or_too_few_nodes_inside_an_allocation_are_refused_at_their_keys(
    inside: list[list[str]],
) -> None:
    with pytest.raises(PlanError) as requeue:
        ask(SlurmSpec(nodes=2, requeue=True))
    assert requeue.value.path == ("slurm", "requeue")
    assert "ends when that job ends" in str(requeue.value)
    with pytest.raises(PlanError) as few:
        ask(SlurmSpec(nodes=4), hosts=4)
    assert few.value.path == ("slurm", "nodes")
    assert (
        "Slurm job 77, which dmlctl runs inside, has 3 nodes; the cluster file asks for 4"
        in str(few.value)
    )
    assert inside == []


def test_the_end_of_a_run_leaves_the_enclosing_allocation_to_its_owner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[list[str]] = []
    me = os.getpid()
    listed = (
        f"77.1|dmlctl-agent-node-0-{me}-3\n77.2|dmlctl-agent-node-0-1-3\n77.3|train\n"
        f"77.4|dmlctl-agent-node-{me}-7-2\n"  # another process's, on a node named like the pid
    )

    def best_effort(argv: list[str], conf: str | None, timeout: float = 0) -> str:
        ran.append(argv)
        return listed if argv[0] == "squeue" else ""

    monkeypatch.setattr(steps, "best_effort", best_effort)
    monkeypatch.setattr(allocation, "best_effort", best_effort)
    allocation.finish(Allocation("77", {"node-0": "lab-4"}, owned=False))
    cancels = [a for a in ran if a[0] == "scancel"]
    assert cancels == [["scancel", "--signal=KILL", "77.1"]]  # this process's step only


def test_a_dry_run_inside_an_allocation_says_it_takes_its_nodes(inside: list[list[str]]) -> None:
    said = slurm_scheduler._dry_assumed(SlurmSpec(nodes=2))
    assert any(line.startswith("dmlctl runs inside Slurm job 77: the run takes") for line in said)
    assert not any(
        "inside" in line for line in slurm_scheduler._dry_assumed(SlurmSpec(allocation="new"))
    )


def test_stop_leaves_the_allocation_dmlctl_ran_inside(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``dmlctl stop`` stops the ranks and, unlike for its own allocation, cancels
    nothing of the one it ran inside; it says what became of each."""
    from dmlctl.launch.options import LaunchOptions
    from dmlctl.runs import control

    monkeypatch.setattr(control, "stop_run", lambda run, timeout: "run r stopped")
    monkeypatch.setattr(allocation, "state", lambda job, conf: JobState("RUNNING"))
    cancelled: list[str] = []
    monkeypatch.setattr(allocation, "cancel", lambda job, conf, name=None: cancelled.append(job))
    run = RunStore(tmp_path).create("r")
    consoles = (Console(file=io.StringIO()), Console(file=io.StringIO()))

    def stop(where: Allocation) -> str:
        plan = make_plan(tmp_path, [1])
        plan = dataclasses.replace(plan, allocation=where)
        scheduler = slurm_scheduler.SlurmScheduler(LaunchOptions(), consoles, SlurmSpec(), plan)
        return scheduler.cancel(run, timeout=1)

    inside = Allocation("77", {"a": "lab-4"}, owned=False)
    assert stop(inside) == "run r stopped; Slurm job 77 (dmlctl ran inside it) left as it is"
    assert cancelled == []
    own = Allocation("78", {"a": "lab-4"}, sbatch=("sbatch",))
    assert stop(own) == "run r stopped; Slurm job 78 cancelled" and cancelled == ["78"]


def test_only_a_job_of_the_cluster_file_s_slurm_is_taken(
    inside: list[list[str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SLURM_JOB_ID of another cluster (the cluster file names another slurm.conf) is
    not looked up there: a new allocation is asked for."""
    mine, other = tmp_path / "mine.conf", tmp_path / "other.conf"
    monkeypatch.setenv("SLURM_CONF", str(mine))
    assert enclosing.enclosing_job(str(mine)) == "77" and enclosing.enclosing_job(None) == "77"
    assert enclosing.enclosing_job(str(other)) is None
    assert ask(SlurmSpec(nodes=2, conf=str(other)))[0].job_id == "78" and len(inside) == 1


def test_a_stale_job_id_is_refused_at_slurm_allocation_and_request_keys_are_said_unused(
    inside: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, said = ask(SlurmSpec(nodes=2, partition="gpu", time="30"))
    assert "slurm.partition, slurm.time: not used inside Slurm job 77" in said
    monkeypatch.setattr(enclosing, "state", lambda job, conf: JobState("GONE"))
    with pytest.raises(PlanError) as gone:
        ask(SlurmSpec(nodes=2))
    assert gone.value.path == ("slurm", "allocation")
    assert "SLURM_JOB_ID says dmlctl runs inside Slurm job 77, which is gone" in str(gone.value)
    assert "slurm.allocation: new asks for an allocation of its own" in str(gone.value)


def test_a_run_inside_a_requeued_allocation_is_not_resumed_on_nodes_it_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dmlctl.errors import UsageError

    monkeypatch.setattr(enclosing, "state", lambda job, conf: JobState("RUNNING", "", "x"))
    monkeypatch.setattr(enclosing, "hostnames", lambda nodelist, conf: ["lab-7", "lab-8"])
    where = Allocation("77", {"node-0": "lab-4", "node-1": "lab-8"}, owned=False)
    with pytest.raises(UsageError, match=r"runs on lab-7, lab-8 now, without the run's lab-4"):
        enclosing.require_nodes(where, "run r cannot be resumed")
    enclosing.require_nodes(dataclasses.replace(where, nodes={"node-0": "lab-8"}), "ok")


def test_status_says_no_time_left_for_a_job_without_a_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dmlctl.launch.options import LaunchOptions

    then = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 3605))
    limit = ["30:00"]
    monkeypatch.setattr(
        allocation, "state", lambda job, conf: JobState("RUNNING", "", "x", then, limit[0])
    )
    plan = dataclasses.replace(make_plan(tmp_path, [1]), allocation=Allocation("9", {"a": "n"}))
    consoles = (Console(file=io.StringIO()), Console(file=io.StringIO()))
    scheduler = slurm_scheduler.SlurmScheduler(LaunchOptions(), consoles, SlurmSpec(), plan)
    run = RunStore(tmp_path / "home").create("r")
    where = scheduler.describe(run)[0]
    assert where.startswith("where: Slurm job 9, running, 1:00:0") and f"(ends {then})" in where
    limit[0] = "UNLIMITED"  # its end time is a year ahead: nothing said
    assert scheduler.describe(run)[0] == "where: Slurm job 9, running"
    assert scheduler.describe(run)[1:] == ["  a: n"]  # no state yet: as planned


def test_status_marks_the_nodes_a_run_no_longer_uses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dmlctl.launch.options import LaunchOptions
    from dmlctl.runs.state import new_run_state

    monkeypatch.setattr(allocation, "state", lambda job, conf: JobState("RUNNING"))
    where = Allocation("9", {"a": "lab-0", "b": "lab-1", "c": "lab-2"})
    plan = dataclasses.replace(make_plan(tmp_path, [1, 1, 1]), allocation=where)
    run = RunStore(tmp_path / "home").create("r")
    run.write_state(new_run_state("r", "j", "ssgd", [(0, "b", "worker"), (1, "c", "worker")], 0.0))
    consoles = (Console(file=io.StringIO()), Console(file=io.StringIO()))
    scheduler = slurm_scheduler.SlurmScheduler(LaunchOptions(), consoles, SlurmSpec(), plan)
    assert scheduler.describe(run)[1:] == ["  a: lab-0 (not in use)", "  b: lab-1", "  c: lab-2"]


def test_requeue_inside_an_allocation_is_refused_by_a_dry_run_too(
    inside: list[list[str]], tmp_path: Path
) -> None:
    from dmlctl.launch.options import LaunchOptions
    from dmlctl.plan.placing import place_job
    from dmlctl.spec.models import ClusterSpec, JobSpec

    spec = SlurmSpec(nodes=2, requeue=True)
    cluster = ClusterSpec.model_validate({"scheduler": "slurm", "slurm": spec.model_dump()})
    job = JobSpec.model_validate({"script": "train.py"})
    consoles = (Console(file=io.StringIO()), Console(file=io.StringIO()))
    scheduler = slurm_scheduler.SlurmScheduler(LaunchOptions(dry_run=True), consoles, spec)
    with pytest.raises(PlanError) as refused:
        scheduler.gather(job, cluster, place_job(cluster, job))
    assert refused.value.path == ("slurm", "requeue")
    assert inside == []
