"""A Slurm ``nodes`` range (``2-4``): parsed once, refused where a run cannot change
its number of hosts or cannot run on the low end, and planned on the nodes Slurm
granted; the doctor's short request; a Slurm refusal named at its key."""

from __future__ import annotations

import pytest

from dmlctl.errors import PlanError
from dmlctl.launch.slurm_doctor import short_request
from dmlctl.plan.placing import place_job
from dmlctl.plan.request import Facts, make_request
from dmlctl.slurm.allocation import Allocation, request_argv
from dmlctl.slurm.commands import refused_key
from dmlctl.slurm.salloc import argv_of
from dmlctl.spec.models import ClusterSpec, JobSpec
from dmlctl.spec.slurm import SlurmSpec, minutes, node_range


def slurm_cluster(**block: object) -> ClusterSpec:
    return ClusterSpec.model_validate({"scheduler": "slurm", "slurm": block})


def job(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"script": "train.py", **fields})


@pytest.mark.parametrize(
    ("value", "fewest", "most"), [(3, 3, 3), ("3", 3, 3), ("2-4", 2, 4), (" 1 - 2 ", 1, 2)]
)
def test_a_node_count_or_range_is_read_once(value: object, fewest: int, most: int) -> None:
    assert node_range(value) == (fewest, most)
    cluster = slurm_cluster(nodes=value)
    spec = cluster.slurm_spec
    assert spec is not None and (spec.min_nodes, spec.max_nodes) == (fewest, most)
    assert [h.name for h in cluster.hosts] == [f"node-{i}" for i in range(most)]
    argv = request_argv(spec, "j")
    assert f"--nodes={spec.nodes}" in argv
    assert ("--ntasks-per-node=1" in argv) == (fewest == most)  # a range gets its most
    assert spec.is_range == (fewest < most)


def test_a_range_the_job_cannot_run_on_at_its_low_end_is_refused_at_slurm_nodes() -> None:
    cluster = slurm_cluster(nodes="2-4")
    assert place_job(cluster, job(workers=3)).workers == 3  # on 2 nodes: 2 (an upper bound)
    assert place_job(cluster.granted(2), job(workers=3)).workers == 2
    with pytest.raises(PlanError) as e:
        place_job(cluster, job(min_hosts=3))
    assert (e.value.spec, e.value.path) == ("cluster", ("slurm", "nodes"))
    assert e.value.message.startswith(
        "Slurm may grant 2 nodes of 2-4, where the job cannot run (min_hosts is 3 but"
    ), e.value.message
    with pytest.raises(PlanError) as e:
        place_job(cluster, job(parameter_servers=1, strategy={"name": "asgd"}))
    assert e.value.path == ("slurm", "nodes")
    assert "not supported with parameter_servers" in e.value.message


def test_a_run_is_planned_on_the_nodes_slurm_granted_and_goes_on_down_to_the_low_end() -> None:
    cluster = slurm_cluster(nodes="2-4")
    spec = job()  # workers: every slot granted
    placement = place_job(cluster, spec)
    assert placement.workers == 4
    granted = Allocation("7", {"node-0": "lab-0", "node-1": "lab-1", "node-2": "lab-2"})
    addresses = {"node-0": "10.0.0.1", "node-1": "10.0.0.2", "node-2": "10.0.0.3"}
    facts = Facts(29500, "python3", addresses=addresses, allocation=granted)
    plan = make_request(spec, cluster, placement, facts, run_id="r", run_dir="/r").plan
    assert [h.name for h in plan.hosts] == ["node-0", "node-1", "node-2"]
    assert [h.address for h in plan.hosts] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert plan.spares == () and plan.world_size == 3
    assert plan.min_hosts == 2  # the range's low end: a lost node does not end the run
    fixed = slurm_cluster(nodes=3)
    request = make_request(spec, fixed, place_job(fixed, spec), facts, run_id="r", run_dir="/r")
    assert request.plan.min_hosts == 3  # a node count: every node


@pytest.mark.parametrize(
    ("time", "expected"),
    [
        ("30", 30),
        ("5:30", 5.5),
        ("2:00:00", 120),
        ("1-0", 1440),
        ("1-2:03", 1563),
        ("0-0:0:30", 0.5),
    ],
)
def test_slurm_times_in_minutes(time: str, expected: float) -> None:
    assert minutes(time) == expected


def test_the_doctors_request_is_short_and_never_requeued() -> None:
    assert short_request(SlurmSpec(time="4:00:00", requeue=True)).time == "10"
    assert short_request(SlurmSpec()).time == "10"
    assert short_request(SlurmSpec(time="3")).time == "3"
    assert short_request(SlurmSpec(time="0")).time == "10"  # '0' is no limit
    assert not short_request(SlurmSpec(requeue=True)).requeue


@pytest.mark.parametrize(
    ("said", "key"),
    [
        ("Batch job submission failed: Invalid partition name specified", ("slurm", "partition")),
        ("Invalid account or account/partition combination specified", ("slurm", "account")),
        ("Invalid qos specification", ("slurm", "qos")),
        ("Requested time limit is invalid (missing or exceeds some limit)", ("slurm", "time")),
        ("Node count specification invalid", ("slurm", "nodes")),
        ("Invalid feature specification", ("slurm",)),
        ("Job violates accounting/QOS policy (job submit limit, user's size)", ("slurm",)),
    ],
)
def test_a_slurm_refusal_is_named_at_the_key_it_is_about(said: str, key: tuple[str, ...]) -> None:
    assert refused_key(said) == key


def test_an_interactive_allocation_is_asked_with_salloc() -> None:
    argv = request_argv(SlurmSpec(nodes=2, salloc=True, partition="dev"), "j", 2)
    assert argv[:4] == ["salloc", "--job-name=dmlctl-j", "--nodes=2", "--ntasks-per-node=1"]
    assert "--parsable" not in argv and "--output=/dev/null" not in argv
    assert "--partition=dev" in argv and "--no-kill" in argv
    assert argv_of(argv, "script")[-3:] == ["sh", "-c", "script"]
    with pytest.raises(ValueError, match="dmlctl holds the allocation itself"):
        SlurmSpec(sbatch_options=["--no-shell"])
