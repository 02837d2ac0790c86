"""A lost host's ranks replaced on another host in place (pure parts): which host can
be, where its ranks go, what that host's agent is told, how the state records it,
and what the stand-in gives each rank."""

from __future__ import annotations

import dataclasses
import json

from dmlctl import protocol, wire
from dmlctl.agent import standin
from dmlctl.agent_config import AgentConfig
from dmlctl.failure import Evidence, Failure, Kind
from dmlctl.launch.host_swap import HostSwap
from dmlctl.plan.model import LaunchPlan
from dmlctl.runs.events import (
    Finished,
    HostDropped,
    HostReplaced,
    MetricRecord,
    Progress,
    RankExited,
    RankStarted,
)
from dmlctl.runs.parser import parse_line
from dmlctl.runs.reducer import apply
from dmlctl.runs.state import Phase, RankStatus, new_run_state
from dmlctl.ui.summary import attempt_lines, dropped_lines, replacement_line
from tests.unit.test_elastic import plan3

SEEN = Evidence.SEEN


def _in_place(**job: object) -> LaunchPlan:
    """Hosts a and b run 2 workers each, c is a spare."""
    return plan3(restart={"mode": "in_place"}, strategy="local-sgd", **job)


def _seated(plan: LaunchPlan) -> HostSwap:
    swap = HostSwap(plan)
    for rank, host in ((0, "a"), (1, "a"), (3, "b"), (2, "b")):
        swap.started(host, rank, rank % 2, "10.0.0.1:41234")
    return swap


def test_a_host_without_rank_0_or_servers_can_be_replaced_once_its_ranks_started() -> None:
    plan = _in_place()
    assert HostSwap(plan).why_not("b", ended=True) == "not every rank of it had started"
    swap = _seated(plan)
    assert swap.why_not("b", ended=True) is None
    assert swap.why_not("a", ended=True) == "it runs rank 0 (its torchrun serves the run's store)"
    assert _seated(plan3(strategy="local-sgd")).why_not("b", ended=True) == HostSwap.RESTART_FULL
    nowhere = HostSwap(plan)
    nowhere.started("b", 2, 0, None)
    nowhere.started("b", 3, 1, None)
    assert nowhere.why_not("b", ended=True) == "no rank said where the run's store is"


def test_a_host_running_a_parameter_server_is_replaced_in_place_ended_or_silent() -> None:
    """Its servers start elsewhere from their snapshots whether its connection ended
    or it fell silent (the workers waiting on a silent one see the replacement's
    address and leave it). A lost server's shard is never left out (no going on
    without it)."""
    restart = {"mode": "in_place", "rejoin_wait": 1}
    plan = plan3(restart=restart, strategy="asgd", parameter_servers=1, workers=3, min_hosts=1)
    assert [(h.name, h.env[protocol.ENV_LOCAL_ROLES]) for h in plan.hosts] == [
        ("a", "worker,worker,server"),
        ("b", "worker"),
    ]
    swap = HostSwap(plan)
    for rank, local in ((1, 0), (2, 1), (3, 2)):
        swap.started("a", rank, local, "10.0.0.2:1")
    swap.started("b", 0, 0, "10.0.0.2:1")
    assert swap.why_not("a", ended=True) is None
    assert swap.why_not("a", ended=False) is None  # silent: its workers leave it then
    assert [h.name for h in swap.targets("a", ended=False)] == ["c"]  # a spare, not itself
    assert swap.why_not("b", ended=True) == "it runs rank 0 (its torchrun serves the run's store)"
    cause = Failure("a", None, "AgentLost", "gone", kind=Kind.AGENT_LOST, evidence=Evidence.SEEN)
    assert swap.go_on_without("a", cause, 1.0, ended=True) == []
    assert swap.go_on_without("b", cause, 1.0, ended=True) == []  # rank 0: never without it
    swap.started("b", 4, 1, "10.0.0.2:1")  # as if b ran one more worker, and a rank 0 elsewhere
    swap.seated["b"].pop(0)
    assert [type(e).__name__ for e in swap.go_on_without("b", cause, 1.0, ended=True)] == [
        "HostDropped",
        "Progress",
    ]  # a worker's host: the others may go on without it


def test_spares_first_then_the_lost_host_itself_when_only_its_connection_ended() -> None:
    swap = _seated(_in_place())
    assert [h.name for h in swap.targets("b", ended=True)] == ["c", "b"]
    assert [h.name for h in swap.targets("b", ended=False)] == ["c"]  # silent: maybe cut off


def test_the_target_agent_starts_the_lost_ranks_into_the_running_world() -> None:
    plan = _in_place()
    swap = _seated(plan)
    spare = swap.targets("b", ended=False)[0]
    config = swap.config("b", spare, attempt=1, grace=5.0)
    again = AgentConfig.from_json(config.to_json())  # as the agent reads it
    assert again == config and config.host == "c"
    assert config.rank_dir.endswith("/attempt-1/rejoin-1")  # never the lost ranks' files
    rejoin = config.rejoin
    assert rejoin is not None
    assert rejoin.ranks == (2, 3)  # in local-rank order
    assert (rejoin.world_size, rejoin.group_rank, rejoin.group_world_size) == (4, 1, 2)
    assert (rejoin.master_addr, rejoin.master_port, rejoin.number) == ("10.0.0.1", 41234, 1)
    assert config.torchrun.nproc == 2 and config.attempt == 1
    assert swap.moved("b", "c") == (2, 3)
    assert swap.targets("a", ended=False) == []  # c is taken
    assert set(swap.placed) == {"c"}


def test_a_host_that_took_a_lost_hosts_ranks_can_be_replaced_in_turn() -> None:
    """c took b's ranks 2 and 3, then c's agent dies too: no spare is left, c itself
    takes them again (a new replacement, in a directory of its own)."""
    swap = _seated(_in_place())
    swap.config("b", swap.targets("b", ended=False)[0], attempt=0, grace=5.0)
    swap.moved("b", "c")
    assert swap.why_not("c", ended=True) is None  # its ranks were seated there as they moved
    assert [h.name for h in swap.targets("c", ended=False)] == []  # cut off: nowhere
    (again,) = swap.targets("c", ended=True)
    config = swap.config("c", again, attempt=0, grace=5.0)
    assert config.host == "c" and config.rejoin is not None
    assert (config.rejoin.ranks, config.rejoin.group_rank, config.rejoin.number) == ((2, 3), 1, 2)
    assert config.rank_dir.endswith("/rejoin-2")


def test_the_state_moves_the_ranks_and_counts_one_failure() -> None:
    ranks = [(0, "a", "worker"), (1, "a", "worker"), (2, "b", "worker"), (3, "b", "worker")]
    state = new_run_state("r", "job", "local-sgd", ranks, 0.0)
    cause = Failure(
        "b", None, "AgentLost", "host agent ended", (), 1.0, kind=Kind.AGENT_LOST, evidence=SEEN
    )
    state = apply(state, [HostReplaced("b", "c", (2, 3), cause, 2.0)])
    assert [(r.rank, r.host, r.status) for r in state.ranks if r.rank >= 2] == [
        (2, "c", RankStatus.RECOVERING),
        (3, "c", RankStatus.RECOVERING),
    ]
    assert state.hosts == ("a", "c") and state.respawns == 1
    assert state.failures == (dataclasses.replace(cause, recovered=True),)
    assert state.root_cause is None
    state = apply(state, [MetricRecord("c", 2, 40, {"loss": 1.0}, 5.0)])
    gaps = {g.rank: g.gap_s for g in state.replacements}
    assert gaps == {2: 4.0, 3: None}  # from the loss; rank 3's has not logged yet
    assert state.replacements[0].cause == "b lost: host agent ended"
    assert attempt_lines(state) == []  # no attempt failed: the ranks were replaced
    lines = [line.plain for line in map(replacement_line, state.replacements)]
    assert lines[0].startswith("rank 2 on c replaced in place at ")
    assert lines[0].endswith("(b lost: host agent ended): back after 4.00 s, at step 40")


def test_a_start_record_says_where_the_runs_store_is() -> None:
    record = {"kind": "start", "local_rank": 1, "pid": 7, "role": "worker", "rank": 3}
    line = json.dumps({**record, "ts": 1.0, "store": "10.0.0.1:41234"})
    events = parse_line("b", wire.encode_rank_record(line), 1.0)
    assert [e.store for e in events if isinstance(e, RankStarted)] == ["10.0.0.1:41234"]


def test_the_stand_in_gives_each_rank_what_torchrun_would_and_marks_it_a_replacement() -> None:
    spec = standin.Order.from_json(_in_place_config_env())
    env = standin.rank_env(
        spec, 1, {"PATH": "/bin", standin.ENV_STANDIN: "x", protocol.ENV_RANK_DIR: "/d"}
    )
    assert standin.ENV_STANDIN not in env and env["PATH"] == "/bin"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
        "3",
        "1",
        "4",
        "2",
    )
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["GROUP_RANK"]) == ("10.0.0.1", "41234", "1")
    assert env[protocol.ENV_REJOIN] == "1" and env["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert env["TORCHELASTIC_ERROR_FILE"] == "/d/standin-error-3.json"


def _in_place_config_env() -> str:
    swap = _seated(_in_place())
    config = swap.config("b", swap.targets("b", ended=False)[0], attempt=0, grace=5.0)
    assert config.rejoin is not None
    return config.rejoin.standin_env(config.torchrun)


def test_the_others_go_on_without_a_lost_hosts_ranks_where_the_strategy_and_min_hosts_allow() -> (
    None
):
    cause = Failure("b", None, "AgentLost", "gone", (), 1.0, kind=Kind.AGENT_LOST, evidence=SEEN)
    assert _seated(_in_place()).go_on_without("b", cause, 2.0, True) == []  # min_hosts: all
    never = plan3(restart={"mode": "in_place", "rejoin_wait": 0}, strategy="local-sgd")
    assert _seated(dataclasses.replace(never, min_hosts=1)).go_on_without("b", cause, 2, True) == []
    # Parameter servers see a lost worker's end only when its host closed its sockets:
    # a silent host's workers are not gone on without (the run restarts).
    servers = plan3(restart={"mode": "in_place"}, strategy="asgd", parameter_servers=1)
    silent = _seated(dataclasses.replace(servers, min_hosts=1))
    assert silent.go_on_without("b", cause, 2, False) == []
    assert len(silent.go_on_without("b", cause, 2, True)) == 2
    swap = _seated(_in_place(min_hosts=1))
    dropped, said = swap.go_on_without("b", cause, 2.0, False)  # silent: no servers to tell
    assert dropped == HostDropped("b", (2, 3), cause, 2.0)
    assert isinstance(said, Progress) and said.text == (
        "b lost (gone) and no host can take rank 2, 3: the others go on without them "
        "after restart.rejoin_wait (30 s)"
    )
    ranks = [(0, "a", "worker"), (1, "a", "worker"), (2, "b", "worker"), (3, "b", "worker")]
    state = apply(new_run_state("r", "job", "local-sgd", ranks, 0.0), [dropped])
    assert [r.status for r in state.ranks] == [RankStatus.PENDING] * 2 + [RankStatus.DROPPED] * 2
    assert state.hosts == ("a",) and state.respawns == 1 and state.root_cause is None
    done = [RankExited("a", r, 0, None, 3.0) for r in (0, 1)]
    state = apply(state, [*done, Finished(4.0)])
    assert state.phase is Phase.SUCCEEDED  # the dropped ranks are no failure
    assert attempt_lines(state) == []  # no attempt failed: the others went on
    (line,) = [line.plain for line in dropped_lines(state)]
    assert line.startswith("b lost at ")
    assert line.endswith("(AgentLost: gone): ranks 2, 3 left out, the others went on")


def test_rank_0s_host_is_replaced_when_the_controller_holds_the_store() -> None:
    """With the attempt's store in the controller (``outside``) no host serves it: the
    host of rank 0 goes to a spare like any other, and its agent meets at that store.
    A host running every worker is never replaced (nobody is left to hand the state),
    and the others never go on without rank 0."""
    plan = dataclasses.replace(_in_place(), store_host="127.0.0.1")
    swap = HostSwap(plan, outside="10.0.0.9:4000")
    for rank, host in ((0, "a"), (1, "a"), (3, "b"), (2, "b")):
        swap.started(host, rank, rank % 2, "10.0.0.9:4000")
    assert swap.why_not("a", ended=True) is None
    config = swap.config("a", swap.targets("a", ended=False)[0], attempt=0, grace=5.0)
    assert config.host == "c" and config.rejoin is not None and config.rejoin.ranks == (0, 1)
    assert config.torchrun.rdzv_endpoint == "10.0.0.9:4000" and not config.torchrun.is_host
    assert config.env[protocol.ENV_RUN_STORE] == "10.0.0.9:4000"
    cause = Failure("a", None, "AgentLost", "gone", kind=Kind.AGENT_LOST, evidence=Evidence.SEEN)
    waiting = dataclasses.replace(plan, restart=plan.restart.model_copy(update={"rejoin_wait": 1}))
    alone = HostSwap(waiting, outside="10.0.0.9:4000")
    for rank, host in ((0, "a"), (1, "a"), (3, "b"), (2, "b")):
        alone.started(host, rank, rank % 2, "10.0.0.9:4000")
    assert alone.go_on_without("a", cause, 1.0, ended=True) == []
    everyone = HostSwap(dataclasses.replace(plan, ranks=plan.ranks[:2]), outside="x:1")
    for rank in (0, 1):  # a runs the only two workers
        everyone.started("a", rank, rank, "x:1")
    assert "every worker" in (everyone.why_not("a", ended=True) or "")


def test_the_plan_gives_every_attempt_the_controllers_store() -> None:
    """An agent config with the attempt's store meets there (``is_host`` false on every
    host) and hands it to torchrun (``DMLCTL_RUN_STORE``); without one it is torchrun's."""
    plan = dataclasses.replace(_in_place(), store_host="127.0.0.1")
    first, second = plan.hosts
    assert first.torchrun.is_host and not second.torchrun.is_host
    for host in plan.hosts:
        config = plan.agent_config(host, 1, 5.0, "127.0.0.1:4321")
        assert config.torchrun.rdzv_endpoint == "127.0.0.1:4321"
        assert not config.torchrun.is_host and config.torchrun.rdzv_id.endswith(".1")
        assert config.env[protocol.ENV_RUN_STORE] == "127.0.0.1:4321"
    plain = plan.agent_config(first, 1, 5.0)
    assert plain.torchrun == dataclasses.replace(first.torchrun, rdzv_id=plain.torchrun.rdzv_id)
    assert protocol.ENV_RUN_STORE not in plain.env
    assert LaunchPlan.from_dict(plan.to_dict()).store_host == "127.0.0.1"
