"""The one placement rule, for the first plan and every re-plan: examples, and
properties over small generated clusters (1-5 hosts of 1-4 slots, 0-2 parameter
servers, with and without ``server_hosts``, ``min_hosts`` and ``max_hosts``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmlctl.errors import PlanError
from dmlctl.plan.build import build_plan
from dmlctl.plan.elastic import CannotReplan, enough, pick_hosts, replan
from dmlctl.plan.model import LaunchPlan
from dmlctl.plan.placement import Demand, HostSlots, NoPlacement, Placed, place
from dmlctl.protocol import ENV_LOCAL_ROLES, ROLE_SERVER, ROLE_WORKER
from dmlctl.spec.models import ClusterSpec, JobSpec

NAMES = "abcde"


def test_workers_fill_hosts_in_order_and_servers_go_next_to_them_in_turn() -> None:
    hosts = [HostSlots("a", 2), HostSlots("b", 2), HostSlots("c", 2)]
    assert place(hosts, Demand(workers=3, servers=3)) == (
        Placed("a", 2, 2),
        Placed("b", 1, 1),
    )
    assert Placed("a", 2, 1).roles == (ROLE_WORKER, ROLE_WORKER, ROLE_SERVER)


def test_server_hosts_run_only_servers_after_the_worker_hosts() -> None:
    hosts = [HostSlots("ps", 2), HostSlots("a", 1), HostSlots("b", 1), HostSlots("c", 1)]
    demand = Demand(workers=2, servers=3, server_hosts=("ps", "c"))
    assert place(hosts, demand) == (
        Placed("a", 1),
        Placed("b", 1),
        Placed("ps", 0, 2),
        Placed("c", 0, 1),
    )


def test_max_hosts_bounds_the_worker_hosts_and_fewer_workers_may_result() -> None:
    hosts = [HostSlots("a", 1), HostSlots("b", 1), HostSlots("c", 1)]
    assert place(hosts, Demand(workers=3, max_hosts=2)) == (Placed("a", 1), Placed("b", 1))


def test_servers_without_a_host_are_refused_with_the_reason() -> None:
    with pytest.raises(NoPlacement, match=r"none of the server_hosts \(ps\) is available"):
        place([HostSlots("a", 1)], Demand(workers=1, servers=1, server_hosts=("ps",)))
    with pytest.raises(NoPlacement, match="no host can run workers"):
        place([], Demand(workers=1, servers=1))


# ----------------------------------------------------------- the re-plan bug (issue 13)


def asgd_plan(slots: tuple[int, ...], **job: Any) -> LaunchPlan:
    hosts = [
        {"name": n, "address": f"10.0.0.{i}", "slots": s, "python": "/py"}
        for i, (n, s) in enumerate(zip(NAMES, slots, strict=False), start=1)
    ]
    spec = JobSpec.model_validate(
        {"script": "train.py", "strategy": "asgd", "parameter_servers": 1, **job}
    )
    return build_plan(
        ClusterSpec.model_validate({"hosts": hosts}),
        spec,
        run_id="r",
        rdzv_port=29500,
        local_python="/py",
        local_run_dir="/runs/r",
    )


def roles(plan: LaunchPlan) -> list[tuple[str, str]]:
    return [(r.host, r.role) for r in plan.ranks]


def test_a_replan_onto_spares_keeps_the_parameter_server() -> None:
    plan = asgd_plan((2, 2, 2), workers=2)
    assert roles(plan) == [("a", "worker"), ("a", "worker"), ("a", "server")]
    assert [h.name for h in plan.spares] == ["b", "c"]
    new = replan(plan, {"b", "c"}, "10.0.0.2:4000")
    assert roles(new) == [("b", "worker"), ("b", "worker"), ("b", "server")]
    (b,) = new.hosts
    assert b.env[ENV_LOCAL_ROLES] == "worker,worker,server"
    assert (b.nproc, b.torchrun.nproc, new.world_size) == (3, 3, 3)


def test_a_replan_onto_smaller_spares_keeps_the_server_with_fewer_workers() -> None:
    plan = asgd_plan((2, 1, 1), workers=2)  # max_hosts defaults to the planned 1 host
    new = replan(plan, {"b", "c"}, "10.0.0.2:4000")
    assert roles(new) == [("b", "worker"), ("b", "server")]
    assert new.hosts[0].env[ENV_LOCAL_ROLES] == "worker,server"


def test_a_lost_server_host_is_replaced_by_another_of_server_hosts() -> None:
    plan = asgd_plan((1, 1, 1, 1), workers=2, server_hosts=["c", "d"])
    assert roles(plan) == [("a", "worker"), ("b", "worker"), ("c", "server")]
    new = replan(plan, {"a", "b", "d"}, plan.rdzv_endpoint)
    assert roles(new) == [("a", "worker"), ("b", "worker"), ("d", "server")]
    assert new.hosts[2].env[ENV_LOCAL_ROLES] == "server"
    assert ENV_LOCAL_ROLES not in new.spares[0].env  # c, a spare now
    assert not enough(plan, {"a", "b"}) and pick_hosts(plan, {"a", "b"}) == []
    with pytest.raises(CannotReplan, match=r"none of the server_hosts \(c, d\) is available"):
        replan(plan, {"a", "b"}, plan.rdzv_endpoint)


# ------------------------------------------------------------------------ properties


@dataclass(frozen=True)
class Case:
    slots: tuple[int, ...]
    job: dict[str, Any]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    slots = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=5)))
    names = list(NAMES[: len(slots)])
    servers = draw(st.integers(0, 2))
    job: dict[str, Any] = {"script": "train.py"}
    if draw(st.booleans()):
        job["workers"] = draw(st.integers(1, sum(slots)))
    if servers:
        job |= {"strategy": "asgd", "parameter_servers": servers}
        if len(names) > 1 and draw(st.booleans()):
            job["server_hosts"] = draw(
                st.lists(st.sampled_from(names), min_size=1, max_size=len(names) - 1, unique=True)
            )
    else:
        low = draw(st.none() | st.integers(1, len(names)))
        high = draw(st.none() | st.integers(low or 1, len(names)))
        job |= {k: v for k, v in (("min_hosts", low), ("max_hosts", high)) if v is not None}
    return Case(slots, job)


def plan_of(case: Case) -> LaunchPlan | None:
    hosts = [
        {"name": n, "address": f"10.0.0.{i}", "slots": s, "python": "/py"}
        for i, (n, s) in enumerate(zip(NAMES, case.slots, strict=False), start=1)
    ]
    try:
        return build_plan(
            ClusterSpec.model_validate({"hosts": hosts}),
            JobSpec.model_validate(case.job),
            run_id="r",
            rdzv_port=29500,
            local_python="/py",
            local_run_dir="/runs/r",
        )
    except PlanError:
        return None  # refused at plan time: nothing to re-plan


PROPERTY = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY
@given(cases())
def test_replanning_on_the_same_hosts_gives_the_same_plan(case: Case) -> None:
    plan = plan_of(case)
    if plan is None:
        return
    everyone = {h.name for h in (*plan.hosts, *plan.spares)}
    for available in (everyone, {h.name for h in plan.hosts}):
        assert replan(plan, available, plan.rdzv_endpoint) == plan


def check_replanned(plan: LaunchPlan, new: LaunchPlan, available: set[str]) -> None:
    """Every role the job asks for, within the bounds, on available hosts only."""
    count = Counter(r.role for r in new.ranks)
    assert count[ROLE_SERVER] == plan.parameter_servers
    assert 1 <= count[ROLE_WORKER] <= plan.workers
    assert {h.name for h in new.hosts} <= available
    assert len(new.hosts) >= (plan.min_hosts or len(plan.hosts))
    worker_hosts = {r.host for r in new.ranks if r.role == ROLE_WORKER}
    assert len(worker_hosts) <= (plan.max_hosts or len(plan.hosts))
    assert not worker_hosts & set(plan.server_hosts)
    assert [r.rank for r in new.ranks] == list(range(new.world_size))
    assert [h.node_rank for h in new.hosts] == list(range(len(new.hosts)))
    for host in new.hosts:
        mine = [r for r in new.ranks if r.host == host.name]
        assert [r.rank for r in mine] == list(range(host.first_rank, host.first_rank + host.nproc))
        assert sum(r.role == ROLE_WORKER for r in mine) <= host.slots
        assert (host.torchrun.nproc, host.torchrun.nnodes) == (host.nproc, len(new.hosts))
        local_roles = host.env.get(ENV_LOCAL_ROLES)
        expected = ",".join(r.role for r in mine) if plan.parameter_servers else None
        assert local_roles == expected
    everyone = {h.name for h in (*plan.hosts, *plan.spares)}
    assert {h.name for h in new.spares} == everyone - {h.name for h in new.hosts}
    assert all(ENV_LOCAL_ROLES not in h.env and h.nproc == 0 for h in new.spares)


@PROPERTY
@given(cases(), st.data())
def test_replanning_after_any_host_loss_keeps_every_role_or_says_why(
    case: Case, data: st.DataObject
) -> None:
    plan = plan_of(case)
    if plan is None:
        return
    everyone = sorted(h.name for h in (*plan.hosts, *plan.spares))
    lost = set(data.draw(st.lists(st.sampled_from(everyone), min_size=1, unique=True)))
    available = set(everyone) - lost
    try:
        new = replan(plan, available, "10.9.9.9:4000")
    except CannotReplan as e:
        assert str(e) and not enough(plan, available)
        return
    assert enough(plan, available)
    check_replanned(plan, new, available)
