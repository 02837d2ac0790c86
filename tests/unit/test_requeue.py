"""The end of a run's Slurm allocation, judged by the supervisor with scripted agents
and a scripted allocation: the run's root cause, no restart; with ``slurm.requeue`` a
new allocation, the hosts on its nodes, and the run goes on. And the pure pieces: the
plan moved to new nodes, the recorded allocation read back."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path

import pytest

from dmlctl.errors import ProvisionError
from dmlctl.failure import CONTROLLER, Failure, Kind
from dmlctl.launch import requeue
from dmlctl.launch.end_warning import EndWarning
from dmlctl.launch.requeue import Reallocation
from dmlctl.launch.supervisor import Supervisor
from dmlctl.plan.elastic import rebind
from dmlctl.plan.model import LaunchPlan
from dmlctl.runs.state import Phase, RunState
from dmlctl.runs.store import RunStore
from dmlctl.slurm.allocation import Allocation, Granted
from dmlctl.slurm.info import seconds_until
from dmlctl.slurm.record import CURRENT, note_pending, pending, record, recorded
from dmlctl.spec.restart import RestartSpec
from dmlctl.transport.base import Transport
from dmlctl.transport.fake import ScriptedTransport, agent_lines, rank_error
from tests.unit.test_supervisor import RUN_ID, RecordingSink, make_plan

WHERE = Allocation(
    "10", {"a": "lab-0", "b": "lab-1"}, sbatch=("sbatch", "-N2"), requeue=True, warn_s=30
)


class ScriptedAllocation(Reallocation):
    """An allocation that has ended in ``state`` once; ``again`` swaps in agents that
    succeed and moves the plan to ``lab-7``/``lab-8``."""

    def __init__(
        self, run_dir: Path, transports: MutableMapping[str, Transport], state: str
    ) -> None:
        super().__init__(run_dir, WHERE, transports)
        self.state, self.asked = state, 0

    def ended(self, stopping: Callable[[], bool] = lambda: False) -> tuple[str, str] | None:
        why = f"Slurm job {self.where.job_id} {self.state.lower()}: every rank in it was stopped"
        return None if self.asked else (self.state, why)

    def again(
        self,
        plan: LaunchPlan,
        note: Callable[[str], None],
        stopping: Callable[[], bool] = lambda: False,
    ) -> LaunchPlan:
        self.asked += 1
        for r, h in enumerate("ab"):
            self.transports[h] = ScriptedTransport(h, agent_lines([r], host=h))
        self.where = self.where.moved("11", {"a": "lab-7", "b": "lab-8"})
        return rebind(plan, self.where, {"a": "10.0.0.7", "b": "10.0.0.8"})


def supervisor(
    tmp_path: Path,
    transports: dict[str, Transport],
    state: str,
    kind: type[ScriptedAllocation] = ScriptedAllocation,
    standby: bool = False,
) -> tuple[ScriptedAllocation, Supervisor]:
    """A supervisor of a 2-host plan in the allocation ``WHERE``, scripted by ``kind``
    (``standby``: each host gets a standby agent as soon as its rank runs)."""
    plan = dataclasses.replace(make_plan(tmp_path, [1, 1]), allocation=WHERE)
    run = RunStore(tmp_path / "home").create(RUN_ID)
    realloc = kind(run.path, transports, state)
    sup = Supervisor(
        plan,
        run,
        transports,
        RecordingSink(),
        fail_grace=0.2,
        restart=RestartSpec(max_infra_restarts=1, backoff_initial=0.01),
        reallocation=realloc,
        standby=standby,
        warm_after=0.0,
    )
    return realloc, sup


def supervise(tmp_path: Path, state: str) -> tuple[ScriptedAllocation, Supervisor, RunState]:
    killed = rank_error("RuntimeError", "Connection closed by peer")
    transports: dict[str, Transport] = {
        "a": ScriptedTransport("a", agent_lines([0], host="a", errors={0: killed})),
        "b": ScriptedTransport("b", agent_lines([1], host="b")),
    }
    realloc, sup = supervisor(tmp_path, transports, state)
    return realloc, sup, sup.run()


def requeued_once(state: RunState, realloc: ScriptedAllocation) -> Failure:
    """The run succeeded after one restart on one new allocation; the end that asked
    for it (the controller's ``AllocationRequeued``)."""
    assert state.phase is Phase.SUCCEEDED and realloc.asked == 1 and state.restarts == 1
    (cause,) = [f for f in state.failures if f.kind is Kind.REQUEUED]
    assert cause.exc_type == "AllocationRequeued" and cause.host == CONTROLLER
    return cause


def test_an_allocation_preempted_with_requeue_goes_on_on_a_new_one(tmp_path: Path) -> None:
    realloc, sup, state = supervise(tmp_path, "PREEMPTED")
    cause = requeued_once(state, realloc)
    assert cause.message == (
        "Slurm job 10 preempted: every rank in it was stopped; slurm.requeue asks for a new "
        "one while restart.max_infra_restarts allows"
    )
    first = sup.plan
    assert first.allocation is not None and first.allocation.job_id == "11"
    assert [h.address for h in first.hosts] == ["10.0.0.7", "10.0.0.8"]
    assert first.rdzv_endpoint.startswith("10.0.0.7:")
    assert all("10.0.0.7:" in " ".join(h.torchrun_argv) for h in first.hosts)


def test_an_allocation_cancelled_is_the_root_cause_and_no_restart(tmp_path: Path) -> None:
    realloc, _, state = supervise(tmp_path, "CANCELLED")
    assert state.phase is Phase.FAILED and realloc.asked == 0 and state.restarts == 0
    cause = state.root_cause
    assert cause is not None and cause.kind is Kind.ALLOCATION, state.failures
    assert cause.message == "Slurm job 10 cancelled: every rank in it was stopped"
    assert state.exit_code == 1


def test_a_plan_moved_to_new_nodes_and_the_allocation_read_back(tmp_path: Path) -> None:
    plan = dataclasses.replace(make_plan(tmp_path, [1, 1]), allocation=WHERE)
    moved = WHERE.moved("12", {"a": "lab-3", "b": "lab-4"})
    assert (moved.sbatch, moved.requeue, moved.job_id) == (WHERE.sbatch, True, "12")
    rebound = rebind(plan, moved, {"a": "10.0.0.3"})
    assert [h.address for h in rebound.hosts] == ["10.0.0.3", plan.hosts[1].address]
    assert rebound.allocation == moved and rebound.ranks == plan.ranks
    assert recorded(tmp_path, WHERE) is WHERE  # nothing recorded: the planned one
    record(tmp_path, moved)
    assert recorded(tmp_path, WHERE) == moved
    assert not list(tmp_path.glob("*.part"))  # written whole, by a rename
    (tmp_path / CURRENT).write_text('{"job_id": "12"}')  # damaged: the planned one
    assert recorded(tmp_path, WHERE) is WHERE
    assert pending(tmp_path) is None
    note_pending(tmp_path, "13")
    assert pending(tmp_path) == "13"
    note_pending(tmp_path, None)
    assert pending(tmp_path) is None


class WarnedAllocation(ScriptedAllocation):
    """An allocation that never ends by itself: its time limit is only near."""

    def ended(self, stopping: Callable[[], bool] = lambda: False) -> tuple[str, str] | None:
        return None


def test_a_time_limit_warned_of_stops_the_ranks_and_asks_again_at_once(tmp_path: Path) -> None:
    transports: dict[str, Transport] = {
        h: ScriptedTransport(h, agent_lines([r], host=h)) for r, h in enumerate("ab")
    }
    realloc, sup = supervisor(tmp_path, transports, "RUNNING", WarnedAllocation)
    lefts = iter([600.0, 25.0, 20.0])
    warning = EndWarning(realloc, sup.post, lambda _: next(lefts))
    assert warning.check() == 10.0  # 600 s left, warned at 30: look again in 10 s
    assert warning.check() == 10.0 and realloc.warned == "10"  # 25 s left: posted
    assert warning.check() == 10.0  # once per job
    state = sup.run()
    cause = requeued_once(state, realloc)
    assert cause.message == (
        "Slurm job 10 reaches its time limit in 25 s (slurm.warn_before_end: 30): its ranks "
        "were stopped to save; a new allocation is asked for (slurm.requeue)"
    )
    assert sup.plan.allocation is not None and sup.plan.allocation.job_id == "11"
    assert next(lefts) == 20.0  # the new job was not looked at yet


def test_a_standby_agent_warm_on_an_old_node_never_runs_the_next_attempt(
    tmp_path: Path,
) -> None:
    """Warned of its time limit, the old job still runs when the run asks again, and so
    do the standby agents started in it: they are stopped unused, and the next attempt's
    agents start on the new nodes (taken, an old one would run it on a node Slurm is
    cancelling)."""
    old = {
        h: ScriptedTransport(
            h, agent_lines([r], host=h, exits={r: None}, agent_code=None), hang=True
        )
        for r, h in enumerate("ab")
    }
    transports: dict[str, Transport] = dict(old)
    realloc, sup = supervisor(tmp_path, transports, "RUNNING", WarnedAllocation, standby=True)
    lefts = iter([25.0])
    warning = EndWarning(realloc, sup.post, lambda _: next(lefts))

    def warn_once_warm() -> None:  # both standbys up beside the running ranks: warned
        deadline = time.monotonic() + 10
        while any(len(t.processes) < 2 for t in old.values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        warning.check()

    threading.Thread(target=warn_once_warm, daemon=True).start()
    done: list[RunState] = []
    runner = threading.Thread(target=lambda: done.append(sup.run()), daemon=True)
    runner.start()
    runner.join(20)
    assert done, "the next attempt ran on an old node's standby agent and never ended"
    state = done[0]
    requeued_once(state, realloc)
    for t in old.values():
        first, spare = t.processes
        assert first.sent and spare.sent == []  # the standby never got a configuration
        deadline = time.monotonic() + 5
        while spare.wait(0) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert spare.stdin_closed and spare.wait(0) is not None
    for h in "ab":
        new = transports[h]
        assert isinstance(new, ScriptedTransport) and new.processes[0].sent


def test_the_seconds_until_the_end_time_slurm_says() -> None:
    now = time.mktime(time.strptime("2026-11-28T12:00:00", "%Y-%m-%dT%H:%M:%S"))
    assert seconds_until("2026-11-28T12:01:30", now) == 90
    assert seconds_until("N/A", now) is None and seconds_until("Unknown", now) is None
    assert seconds_until("", now) is None


def test_the_new_nodes_are_readied_before_the_run_goes_on_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeue cancels the old job, asks again, records the new job, swaps the
    transports, and has the new nodes readied (the job synced, its setup run) with the
    moved plan; a node that cannot be readied stops it there."""
    calls: list[str] = []
    granted = Granted("11", ["lab-7", "lab-8"], {"lab-7": "10.0.0.7", "lab-8": "10.0.0.8"})
    monkeypatch.setattr(requeue.allocation, "cancel", lambda job, conf: calls.append(job))
    monkeypatch.setattr(requeue.allocation, "allocate", lambda *a, **k: granted)
    readied: list[LaunchPlan] = []
    plan = dataclasses.replace(make_plan(tmp_path, [1, 1]), allocation=WHERE)
    transports: dict[str, Transport] = {}
    realloc = Reallocation(tmp_path, WHERE, transports, readied.append)
    moved = realloc.again(plan, lambda _: None)
    assert calls == ["10"] and readied == [moved]
    assert [h.address for h in moved.hosts] == ["10.0.0.7", "10.0.0.8"]
    assert set(transports) == {"a", "b"} and recorded(tmp_path, WHERE) == realloc.where

    def broken(_: LaunchPlan) -> None:
        raise ProvisionError("code sync failed: a: no space left")

    again = Reallocation(tmp_path, WHERE, {}, broken)
    with pytest.raises(ProvisionError, match="no space left"):
        again.again(plan, lambda _: None)
