"""Re-planning after host loss (pure) and the host pool's set-aside / wait rules
(scripted probes and a fake clock: no hosts, no waiting)."""

from __future__ import annotations

import pytest

from dmlctl.launch.hosts import HostPool, HostsLost
from dmlctl.plan.build import build_plan
from dmlctl.plan.elastic import CannotReplan, enough, pick_hosts, replan
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.spec.models import ClusterSpec, JobSpec


def plan3(**job: object) -> LaunchPlan:
    """Three remote hosts with 2 slots each; the job asks for 4 workers by default."""
    hosts = [
        {"name": n, "address": f"10.0.0.{i}", "slots": 2, "python": "/py"}
        for i, n in enumerate(("a", "b", "c"), start=1)
    ]
    cluster = ClusterSpec.model_validate({"hosts": hosts})
    spec = JobSpec.model_validate({"script": "train.py", "workers": 4, **job})
    return build_plan(
        cluster, spec, run_id="r", rdzv_port=29500, local_python="/py", local_run_dir="/runs/r"
    )


def argv_value(host: HostPlan, flag: str) -> str:
    return host.torchrun_argv[host.torchrun_argv.index(flag) + 1]


def test_the_plan_keeps_the_other_hosts_as_spares() -> None:
    plan = plan3(min_hosts=1)
    assert [h.name for h in plan.hosts] == ["a", "b"]
    assert [h.name for h in plan.spares] == ["c"]
    assert (plan.min_hosts, plan.max_hosts, plan.workers) == (1, 2, 4)


def test_a_spare_replaces_a_lost_host_and_ranks_are_renumbered() -> None:
    plan = plan3(min_hosts=1)
    new = replan(plan, {"b", "c"}, "10.0.0.2:4000")
    assert [(h.name, h.node_rank, h.nproc, h.first_rank) for h in new.hosts] == [
        ("b", 0, 2, 0),
        ("c", 1, 2, 2),
    ]
    assert [(r.rank, r.host) for r in new.ranks] == [(0, "b"), (1, "b"), (2, "c"), (3, "c")]
    assert [h.name for h in new.spares] == ["a"]
    b, c = new.hosts
    assert argv_value(b, "--rdzv-endpoint") == "10.0.0.2:4000"
    assert argv_value(b, "--rdzv-conf") == "is_host=true,run=r"
    assert argv_value(c, "--rdzv-conf") == "is_host=false,run=r"
    assert argv_value(b, "--local-addr") == "10.0.0.2"
    assert "--local-addr" not in c.torchrun_argv
    assert argv_value(c, "--nnodes") == "2"
    assert (new.world_size, new.rdzv_endpoint, new.run_id) == (4, "10.0.0.2:4000", "r")


def test_the_world_shrinks_to_the_hosts_left_when_min_hosts_allows() -> None:
    plan = plan3(min_hosts=1, max_hosts=2)
    new = replan(plan, {"c"}, "10.0.0.3:4000")
    assert [(h.name, h.nproc) for h in new.hosts] == [("c", 2)]
    assert new.world_size == 2 and argv_value(new.hosts[0], "--nnodes") == "1"
    assert "--local-addr" not in new.hosts[0].torchrun_argv


def test_too_few_hosts_cannot_carry_the_run() -> None:
    plan = plan3()  # min_hosts defaults to every planned host: 2
    assert enough(plan, {"a", "c"}) and not enough(plan, {"c"})
    with pytest.raises(CannotReplan, match=r"only 1 host.*min_hosts is 2"):
        replan(plan, {"c"}, "x:1")


def test_max_hosts_and_workers_bound_the_hosts_picked() -> None:
    plan = plan3(min_hosts=1, max_hosts=1, workers=2)
    assert [h.name for h in plan.hosts] == ["a"]
    assert [h.name for h in pick_hosts(plan, {"a", "b", "c"})] == ["a"]
    assert [h.name for h in pick_hosts(plan, {"b", "c"})] == ["b"]


def test_min_hosts_larger_than_max_hosts_is_refused() -> None:
    with pytest.raises(ValueError, match=r"max_hosts\n.*is smaller than min_hosts \(3\)"):
        JobSpec.model_validate({"script": "t.py", "min_hosts": 3, "max_hosts": 2})


# ------------------------------------------------------------------- the host pool


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def pool(plan: LaunchPlan, answers: dict[str, bool], clock: Clock, **kw: float) -> HostPool:
    def probe(host: HostPlan) -> str | None:
        return None if answers.get(host.name, True) else "connection refused"

    return HostPool(
        plan,
        probe,
        wait=kw.get("wait", 10.0),
        cooldown=kw.get("cooldown", 30.0),
        clock=clock,
        sleep=clock.sleep,
    )


def test_a_lost_host_sits_out_its_cooldown_then_comes_back() -> None:
    clock = Clock()
    answers = {"a": True, "b": True, "c": True}
    p = pool(plan3(min_hosts=1), answers, clock)
    assert p.next_hosts({"a"}) == {"b", "c"}  # a answers, but its cooldown is not over
    clock.now = 31.0
    assert p.next_hosts(()) == {"a", "b", "c"}
    assert not p.aside


def test_a_host_that_does_not_answer_is_set_aside_with_the_reason() -> None:
    clock = Clock()
    p = pool(plan3(min_hosts=1), {"b": False}, clock)
    assert p.next_hosts(()) == {"a", "c"}
    assert p.why["b"] == "connection refused" and "b" in p.aside


def test_too_few_hosts_wait_then_fail_naming_them() -> None:
    clock = Clock()
    notes: list[str] = []
    p = pool(plan3(), {"a": False, "c": False}, clock, wait=5.0)
    with pytest.raises(HostsLost, match=r"1 of the 2 hosts.*waiting 5 s.*a \(connection refused\)"):
        p.next_hosts({"a"}, note=notes.append)
    assert notes and "waiting for hosts: 1 of 2 answer" in notes[0]
    assert 5.0 <= clock.now < 8.0


def test_a_lost_host_answering_while_waiting_is_taken_back_at_once() -> None:
    clock = Clock()
    answers = {"a": False, "c": False}
    p = pool(plan3(), answers, clock, wait=30.0, cooldown=300.0)

    def note(_text: str) -> None:
        answers["a"] = True  # comes back while the pool waits; cooldown does not apply

    assert p.next_hosts({"a"}, note=note) == {"a", "b"}


def test_a_stop_while_waiting_ends_the_wait() -> None:
    clock = Clock()
    p = pool(plan3(), {"a": False, "c": False}, clock, wait=60.0)
    assert p.next_hosts({"a"}, stopping=lambda: True) is None
