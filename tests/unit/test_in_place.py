"""``restart.mode: in_place`` piece by piece, without processes: the job file's
checks, the ranks' environment, which dead rank torchrun forks again, the server's
membership, the respawn record's way to the run's state and budget, and the
replacement's data position and store collectives (a real TCPStore here)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from dmlctl import protocol, wire
from dmlctl.agent.respawn import may_respawn, over_before, record, rejoin_env
from dmlctl.failure import Kind
from dmlctl.launch.policy import RestartState, respawned
from dmlctl.plan.build import build_plan
from dmlctl.ps.channel import Message, Op
from dmlctl.ps.connection import ConnectionLost
from dmlctl.ps.server import ParameterServer
from dmlctl.runs.events import MetricRecord, RankRespawned, RankStarted
from dmlctl.runs.parser import parse_line
from dmlctl.runs.reducer import apply
from dmlctl.runs.state import RankStatus, RunState, new_run_state
from dmlctl.runtime import rejoin
from dmlctl.runtime.signed_store import SignedStore
from dmlctl.spec import load_job
from dmlctl.spec.cluster import ClusterSpec, HostSpec
from dmlctl.spec.models import JobSpec
from dmlctl.spec.restart import RestartSpec
from tests.unit.test_spec import only_issue, write

# ----------------------------------------------------------------- the job file


HEAD = "script: train.py\nworkers: 2\n"
IN_PLACE = "restart: {mode: in_place}\n"


@pytest.mark.parametrize(
    ("text", "line", "path", "fragment"),
    [
        (
            HEAD + "strategy: cyclades\n" + IN_PLACE,
            4,
            "restart.mode",
            "does not apply to strategy 'cyclades'",
        ),
        (
            HEAD + "strategy: {name: local-sgd, params: {hierarchical: true}}\n" + IN_PLACE,
            4,
            "restart.mode",
            "'local-sgd' with hierarchical: true (its host rounds run in subgroups); use full",
        ),
        (
            HEAD + "strategy: hogwild\n" + IN_PLACE,
            4,
            "restart.mode",
            "(in place: aadmm, adadelay, admm, asgd, bmuf, dpsgd, easgd, easgd-async, "
            "local-sgd, ssgd, ssp, sync-ps)",
        ),
        (
            HEAD + "strategy: {name: ssgd, params: {compression: powersgd}}\n" + IN_PLACE,
            4,
            "restart.mode",
            "'ssgd' with compression 'powersgd' (it works on DDP's gradient buckets, which "
            "in place does not use; none, fp16 and bf16 apply); use full",
        ),
        (
            HEAD + "strategy: ssgd\n" + IN_PLACE + "parallelism: {tensor_parallel_degree: 2}\n",
            5,
            "parallelism",
            "does not combine with restart.mode: in_place",
        ),
    ],
)
def test_in_place_is_refused_where_a_replacement_could_not_join(
    tmp_path: Path, text: str, line: int, path: str, fragment: str
) -> None:
    (tmp_path / "train.py").write_text("")
    issue = only_issue(load_job, write(tmp_path, text))
    assert (issue.line, issue.path) == (line, path), issue
    assert fragment in issue.message


@pytest.mark.parametrize(
    "strategy",
    ["parameter_servers: 1\nstrategy: asgd", "strategy: {name: ssgd, params: {compression: bf16}}"],
)
def test_in_place_is_taken_for_asgd_and_ssgd(tmp_path: Path, strategy: str) -> None:
    (tmp_path / "train.py").write_text("")
    job = load_job(write(tmp_path, HEAD + strategy + "\n" + IN_PLACE))
    assert job.restart.mode == "in_place"
    text = HEAD + strategy + "\n" + IN_PLACE + "checkpoint: {keep: 2}\n"
    assert load_job(write(tmp_path, text)).checkpoint is not None  # one worker saves


def test_the_ranks_learn_the_mode_and_their_budget(tmp_path: Path) -> None:
    cluster = ClusterSpec(hosts=[HostSpec(name="a", address="localhost", slots=2)])

    def env(restart: RestartSpec, strategy: str = "asgd") -> dict[str, str]:
        job = JobSpec(
            script="train.py",
            workdir=str(tmp_path),
            strategy={"name": strategy},
            parameter_servers=1,
            restart=restart,
        )
        plan = build_plan(
            cluster, job, run_id="r", rdzv_port=1, local_python="python3", local_run_dir="/x"
        )
        return dict(plan.hosts[0].env)

    got = env(RestartSpec(mode="in_place", max_infra_restarts=2, ps_snapshot_every=70))
    assert (got[protocol.ENV_RESTART_MODE], got[protocol.ENV_RESPAWNS]) == ("in_place", "2")
    assert (got[protocol.ENV_RESPAWN_SERVERS], got[protocol.ENV_PS_SNAPSHOT_EVERY]) == ("1", "70")
    assert protocol.ENV_RESTART_MODE not in env(RestartSpec())
    rounds = env(RestartSpec(mode="in_place"), "sync-ps")  # servers in rounds: replaced too
    assert (rounds[protocol.ENV_RESPAWN_SERVERS], rounds[protocol.ENV_PS_SNAPSHOT_EVERY]) == (
        "1",
        "500",
    )


# ----------------------------------------------------------------- the agent


def _env(**extra: str) -> dict[str, str]:
    return {
        protocol.ENV_RESTART_MODE: protocol.IN_PLACE,
        protocol.ENV_RESPAWNS: "2",
        protocol.ENV_LOCAL_ROLES: "worker,server",
        "LOCAL_RANK": "0",
        **extra,
    }


def test_only_a_worker_killed_by_sigkill_within_its_budget_is_forked_again() -> None:
    killed = -signal.SIGKILL
    assert may_respawn(_env(), killed, 0) and may_respawn(_env(), killed, 1)
    assert not may_respawn(_env(), killed, 2)  # the budget is spent
    assert not may_respawn(_env(), 1, 0)  # it failed by itself
    assert not may_respawn(_env(), -signal.SIGSEGV, 0)  # it crashed
    assert not may_respawn(_env(LOCAL_RANK="1"), killed, 0)  # a server
    servers = _env(LOCAL_RANK="1", **{protocol.ENV_RESPAWN_SERVERS: "1"})
    assert may_respawn(servers, killed, 0)  # ... where its strategy's servers can be
    assert not may_respawn({**_env(), protocol.ENV_RESTART_MODE: ""}, killed, 0)  # mode: full
    assert rejoin_env(_env(), 2)[protocol.ENV_REJOIN] == "2"


def test_a_worker_whose_part_was_over_is_not_forked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """... and its kill is no failure of the run (torchrun is told 0; it is said)."""
    env = _env(**{protocol.ENV_RANK_DIR: str(tmp_path), "RANK": "3", protocol.ENV_ATTEMPT: "2"})
    assert may_respawn(env, -signal.SIGKILL, 0) and not over_before(env, -signal.SIGKILL)
    monkeypatch.setenv(protocol.ENV_ATTEMPT, "1")  # another attempt's mark is not its own
    rejoin.Position(str(tmp_path), 3).finish()
    assert may_respawn(env, -signal.SIGKILL, 0)
    monkeypatch.setenv(protocol.ENV_ATTEMPT, "2")
    rejoin.Position(str(tmp_path), 3).finish()  # its context closed (the servers let it go)
    assert not may_respawn(env, -signal.SIGKILL, 0)
    assert not over_before(env, 1) and capsys.readouterr().err == ""  # failed by itself
    assert over_before(env, -signal.SIGKILL)
    assert "rank 3 was killed by SIGKILL after its part of the run was over" in (
        capsys.readouterr().err
    )
    lines = (tmp_path / "rank-3.events.jsonl").read_text().splitlines()
    assert [(r["kind"], r["code"]) for r in map(json.loads, lines)] == [("exit", 0)]
    assert not over_before({**env, protocol.ENV_RESTART_MODE: ""}, -signal.SIGKILL)  # full


def test_a_worker_lost_after_its_training_is_not_forked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its last round with its peers done (the final model, at the data's end), they
    are past every round a replacement could join: the run restarts as a whole
    instead, and says why — until it trains again (a script that iterates anew)."""
    from dmlctl.runtime.cursor import DataCursor
    from dmlctl.runtime.metrics import MetricLogger

    monkeypatch.setenv(protocol.ENV_ATTEMPT, "1")
    env = _env(**{protocol.ENV_RANK_DIR: str(tmp_path), "RANK": "2", protocol.ENV_ATTEMPT: "1"})
    cursor = DataCursor(MetricLogger(2, None), position=rejoin.Position(str(tmp_path), 2))
    cursor.on_end(lambda: ran.append(may_respawn(env, -signal.SIGKILL, 0)))  # the final round
    cursor.on_end(cursor.trained)
    ran: list[bool] = []
    cursor.end()
    assert ran == [True] and cursor.started()  # a replacement at its end: in the collectives
    assert not may_respawn(env, -signal.SIGKILL, 0)
    assert "rank 2 was lost after its training was over" in capsys.readouterr().err
    assert not over_before(env, -signal.SIGKILL)  # a failure of the run: not finished
    cursor.count(32)  # it trains again
    assert may_respawn(env, -signal.SIGKILL, 0)


def test_the_respawn_record_reaches_the_state_as_a_rank_recovering(tmp_path: Path) -> None:
    record({**_env(), protocol.ENV_RANK_DIR: str(tmp_path), "RANK": "1"}, -9, 4242)
    line = (tmp_path / "rank-1.events.jsonl").read_text().strip()
    events = parse_line("h", wire.encode_rank_record(line), 0.0)
    (ev,) = events
    assert isinstance(ev, RankRespawned) and ev.pid == 4242
    assert ev.cause.message == "killed by SIGKILL; started again in place"
    assert ev.cause.kind is Kind.KILLED
    state = new_run_state("r", "j", "asgd", [(0, "h", "worker"), (1, "h", "worker")], 0.0)
    state = apply(state, [ev])
    assert state.ranks[1].status is RankStatus.RECOVERING and state.respawns == 1
    assert state.restarts == 0
    assert state.failures == (dataclasses.replace(ev.cause, recovered=True),)
    from rich.console import Console

    from dmlctl.ui.format import run_header

    def header(width: int = 160) -> str:
        console = Console(width=width, color_system=None, record=True)
        console.print(run_header(state, 2.0))
        return console.export_text()

    assert "restarts 0 (+1 in place)  world 2 (1 rejoining)" in header()
    narrow = header(48).splitlines()[1:]  # a field that does not fit goes whole
    assert narrow[:3] == [
        "pending  elapsed 0:00:02",
        "restarts 0 (+1 in place)  world 2 (1 rejoining)",
        "hosts 1",
    ], narrow
    state = apply(state, [RankStarted("h", 1, 1, "worker", 4242, 1.0)])
    assert state.ranks[1].status is RankStatus.RECOVERING  # started, not training yet
    (gap,) = state.replacements
    assert (gap.rank, gap.host, gap.back_at, gap.gap_s) == (1, "h", None, None)
    assert gap.cause == "killed by SIGKILL; started again in place"
    state = apply(state, [MetricRecord("h", 1, 50, {"loss": 0.5}, gap.lost_at + 1.5)])
    assert state.ranks[1].status is RankStatus.RUNNING
    assert "world 2  hosts" in header()  # trained again: whole
    (gap,) = state.replacements
    assert (gap.step, gap.gap_s) == (50, 1.5)  # its first record closed the gap
    state = apply(state, [MetricRecord("h", 1, 100, {"loss": 0.4}, gap.lost_at + 9.0)])
    assert state.replacements == (gap,)
    twice = apply(state, [ev, ev, MetricRecord("h", 1, 150, {}, gap.lost_at + 12.0)])
    assert [g.step for g in twice.replacements] == [50, 150, 150]  # both gaps closed
    assert RunState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    from dmlctl.ui.summary import render_run_detail

    console = Console(width=200, color_system=None, record=True)
    console.print(render_run_detail(state, 2.0))
    detail = console.export_text()
    assert "rank 1 on h replaced in place at " in detail
    assert " (killed by SIGKILL; started again in place): back after 1.50 s, at step 50" in detail
    assert "attempt 1 failed" not in detail  # a replacement is no failed attempt
    # A script that counts its own steps starts them again: its data position is shown.
    lost = apply(state, [ev])
    sharded = apply(
        lost,
        [MetricRecord("h", 1, 5, {"loss": 0.4, "progress": 0.34, "epoch": 1}, gap.lost_at + 20)],
    )
    newest = sharded.replacements[-1]
    assert (newest.step, newest.progress, newest.epoch) == (5, 0.34, 1)
    console = Console(width=200, color_system=None, record=True)
    console.print(render_run_detail(sharded, 2.0))
    assert "34% through its data (epoch 1, its step 5)" in console.export_text()


def test_a_replacement_spends_an_infra_restart() -> None:
    after = respawned(RestartState(), 1)
    assert (after.infra_restarts_used, after.user_restarts_used, after.attempt) == (1, 0, 0)


# ----------------------------------------------------------------- the server


class _Replies:
    def __init__(self, gone: set[int] | None = None) -> None:
        self.sent: list[int] = []
        self.gone = gone or set()

    def receive(self, timeout: float | None = None) -> Message | None:
        raise AssertionError("messages are handed to handle()")

    def reply(
        self, worker: int, shard_id: int, version: int, flat: torch.Tensor, min_clock: int = 0
    ) -> None:
        if worker in self.gone:
            raise ConnectionLost(f"worker rank {worker}: Connection closed by peer")
        self.sent.append(worker)

    def send_blob(self, worker: int, blob: bytes) -> None:
        del worker, blob


def test_a_worker_that_left_is_waited_for_by_nobody_until_it_says_hello() -> None:
    replies = _Replies()
    server = ParameterServer(
        {0: torch.zeros(2)}, [0, 1], replies, lr=0.1, staleness_bound=0, elastic=True
    )
    server.handle(Message(Op.PULL, 1, 0, 0))  # answered: everybody at clock 0
    server.handle(Message(Op.PULL, 0, 5, 0))  # waits for worker 1 (bound 0)
    assert replies.sent == [1]
    server.handle(Message(Op.LEFT, 1, 0, -1))  # worker 1 died
    assert server.away == {1} and server.departures == 1
    assert replies.sent == [1, 0]  # nobody waits for it any more
    server.handle(Message(Op.HELLO, 1, 0, -1))  # its replacement connected
    assert server.away == set()
    server.handle(Message(Op.PULL, 0, 9, 0))
    assert replies.sent == [1, 0]  # and it is waited for again


class _Script(_Replies):
    """Hands ``serve`` the messages in order; a ``None`` in them is a receive that
    waits out its timeout (recorded)."""

    def __init__(self, messages: list[Message | None]) -> None:
        super().__init__()
        self.messages, self.waits = messages, list[float | None]()

    def receive(self, timeout: float | None = None) -> Message | None:
        msg = self.messages.pop(0)
        if msg is None:
            self.waits.append(timeout)
            time.sleep(timeout or 0)  # as a real wait for messages that do not come
        return msg


def test_a_worker_away_past_rejoin_wait_is_gone_and_the_server_ends_without_it() -> None:
    """Its host lost and no host to take it: worker 1 is away for ``gone_after``
    seconds (restart.rejoin_wait), then gone — the final read of worker 0 stops
    waiting for it, the server ends on worker 0's CLOSE, and the run's store is told
    (``on_gone``); a worker that comes back after all is a worker again."""
    script = _Script(
        [
            Message(Op.HELLO, 0, 0, -1),
            Message(Op.HELLO, 1, 0, -1),
            Message(Op.LEFT, 1, 0, -1),
            Message(Op.DONE, 0, 4, -1),
            Message(Op.PULL, 0, 4, 0, final=True),  # held: worker 1 may come back
            None,  # gone_after passed with no message
            Message(Op.CLOSE, 0, 4, -1),
        ]
    )
    server = ParameterServer({0: torch.zeros(2)}, [0, 1], script, lr=0.1, elastic=True)
    told: list[tuple[int, bool]] = []
    server.gone_after, server.on_gone = 0.05, lambda w, gone: told.append((w, gone))
    server.serve()
    assert script.messages == [] and told == [(1, True)]
    assert len(script.waits) == 1 and 0 < (script.waits[0] or 0) <= 0.05
    assert script.sent == [0]  # the final read, once worker 1 was gone
    assert (server.gone, server.away, server.closed) == ({1}, set(), {0, 1})
    server.handle(Message(Op.HELLO, 1, 0, -1))  # a late replacement
    assert told == [(1, True), (1, False)] and server.closed == {0}


def test_without_in_place_a_worker_that_left_fails_the_server() -> None:
    server = ParameterServer({0: torch.zeros(2)}, [0, 1], _Replies(), lr=0.1)
    with pytest.raises(ConnectionLost, match="worker rank 1: Connection closed by peer"):
        server.handle(Message(Op.LEFT, 1, 0, -1))
    server.handle(Message(Op.CLOSE, 0, 3, -1))
    server.handle(Message(Op.LEFT, 0, 0, -1))  # after its CLOSE: the normal end


def test_a_reply_to_a_worker_gone_is_dropped_in_place() -> None:
    server = ParameterServer({0: torch.zeros(2)}, [0, 1], _Replies({1}), lr=0.1, elastic=True)
    server.handle(Message(Op.PULL, 1, 0, 0))  # its LEFT is on the way: nothing raised
    strict = ParameterServer({0: torch.zeros(2)}, [0, 1], _Replies({1}), lr=0.1)
    with pytest.raises(ConnectionLost):
        strict.handle(Message(Op.PULL, 1, 0, 0))


# ----------------------------------------------------------------- the replacement


def test_the_data_position_survives_its_writer(tmp_path: Path) -> None:
    position = rejoin.Position(str(tmp_path), 3)
    assert position.read() is None
    position.write(2, 17, 517)
    position.write(2, 18, 518)  # overwritten in place
    assert rejoin.Position(str(tmp_path), 3).read() == (2, 18, 518)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_store_collectives_go_on_from_the_predecessors_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch._C._distributed_c10d import PrefixStore

    master = _master(monkeypatch)
    monkeypatch.delenv(protocol.ENV_REJOIN, raising=False)
    other = PrefixStore("dmlctl", master)  # worker 1, as its own client would write
    other.set(rejoin.key("coll/0/1"), "2.0")
    assert rejoin.StoreGroup(0, 2, lambda: True).gather(1.0) == {0: 1.0, 1: 2.0}
    monkeypatch.setenv(protocol.ENV_REJOIN, "1")
    started = False
    replacement = rejoin.StoreGroup(0, 2, lambda: started)
    assert replacement.calls == 1  # its predecessor's one call is not done again
    assert replacement.gather(5.0) == {0: 5.0}  # before its first batch: its own
    assert replacement.calls == 1
    started = True
    other.set(rejoin.key("coll/1/1"), "4.0")
    assert replacement.gather(2.0) == {0: 2.0, 1: 4.0}
    assert not other.check([rejoin.key("coll/0/0")])  # read by all: deleted
    other.set(rejoin.gone_key(1), "1")  # worker 1 left the run: not waited for
    assert replacement.gather(3.0) == {0: 3.0}
    del master


def test_a_replacement_after_every_other_worker_finished_joins_no_round(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Worker 0's host was lost after the run's last collectives, and worker 1 has
    ended its process (its done key): 0's replacement forms its generation at once,
    alone, without marking 1 gone. Its predecessor lost in what the script does after
    training: LostAfterTraining (collateral: the run restarts as a whole); lost after
    its script ended (its finished key): it ends as finished (exit code 0). Where 1
    still runs, or was lost (gone), neither."""
    from torch._C._distributed_c10d import HashStore

    from dmlctl.failure import Kind, exception_kind
    from dmlctl.strategies import members

    store = HashStore()
    store.set(rejoin.done_key(1), "1")  # worker 1 finished the run
    began = time.monotonic()
    assert members.agree(store, 1, 0, 2, wait=30.0) == (0,)
    assert time.monotonic() - began < 5  # not rejoin_wait: 1 never comes
    assert not store.check([rejoin.gone_key(1)])
    with pytest.raises(members.LostAfterTraining, match="restarts as a whole") as lost:
        members.end_if_run_over(store, 0, 2)
    assert exception_kind(lost.value) is Kind.COLLATERAL
    store.set(rejoin.finished_key(0), "1")  # its predecessor's script had ended
    with pytest.raises(members.PartOver) as ended:
        members.end_if_run_over(store, 0, 2)
    assert ended.value.code == 0
    assert "counted as finished" in capsys.readouterr().out
    other = HashStore()
    members.end_if_run_over(other, 0, 2)  # 1 still runs: a round is left
    other.set(rejoin.done_key(1), "1")
    other.set(rejoin.gone_key(1), "1")  # 1 was left out, not finished
    members.end_if_run_over(other, 0, 2)


def test_replacements_past_the_infra_budget_end_the_attempt() -> None:
    from dmlctl.launch.policy import over_budget

    ranks = [(0, "h", "worker"), (1, "h", "worker"), (2, "h", "worker")]
    state = new_run_state("r", "j", "asgd", ranks, 0.0)
    spec = RestartSpec(mode="in_place", max_infra_restarts=1)
    first = parse_line("h", wire.encode_rank_record(_respawn_line(0)), 1.0)
    state = apply(state, first)
    assert over_budget(state, spec) == []  # one replacement: within the budget
    state = apply(state, parse_line("h", wire.encode_rank_record(_respawn_line(1)), 2.0))
    (ended,) = over_budget(state, spec)
    assert (ended.rank, ended.exit_code) == (1, -9)
    assert ended.cause is not None and "started again in place" in ended.cause.message
    assert over_budget(apply(state, [ended]), spec) == []  # the attempt ends once


def _respawn_line(rank: int) -> str:
    record = {"kind": protocol.KIND_RESPAWN, "code": -9, "pid": 100 + rank, "rank": rank}
    return json.dumps({**record, "ts": 1.0}, separators=(",", ":"))


def test_sync_ps_closes_its_rounds_without_a_worker_away() -> None:
    from dmlctl.ps.rounds import BackupRounds, RoundServer

    replies = _Replies()
    rule = BackupRounds(2, 0, "SGD", {"lr": 1.0})
    server = RoundServer({0: torch.zeros(2)}, [0, 1], replies, rule=rule, elastic=True)
    grad = torch.ones(2)
    server.handle(Message(Op.PUSH, 0, 0, 0, grad, then_pull=True))
    assert server.versions[0] == 0 and replies.sent == []  # waits for worker 1's gradient
    server.handle(Message(Op.LEFT, 1, 0, -1))  # worker 1 died: counted as a backup
    assert server.versions[0] == 1 and replies.sent == [0]
    assert torch.equal(server.params[0], -grad)  # the round's mean is worker 0's alone
    server.handle(Message(Op.HELLO, 1, 0, -1))  # its replacement is waited for again
    server.handle(Message(Op.PUSH, 0, 1, 0, grad, then_pull=True))
    assert server.versions[0] == 1
    server.handle(Message(Op.PUSH, 1, 1, 0, grad * 3, then_pull=True))
    assert server.versions[0] == 2 and torch.equal(server.params[0], -3 * grad)


def test_the_final_models_are_compared_through_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._C._distributed_c10d import PrefixStore

    master = _master(monkeypatch)
    monkeypatch.delenv(protocol.ENV_REJOIN, raising=False)
    other = PrefixStore("dmlctl", master)  # worker 1 publishes its digest
    params = [torch.arange(4.0), torch.ones(2, dtype=torch.bfloat16)]
    import zlib

    digest = 0
    for p in params:
        digest = zlib.crc32(p.view(torch.uint8).numpy().tobytes(), digest)
    other.set(rejoin.key("coll/0/1"), repr(float(digest)))
    group = rejoin.StoreGroup(0, 2, lambda: True)
    rejoin.check_one_model(params, group)  # alike
    other.set(rejoin.key("coll/1/1"), repr(float(digest ^ 1)))
    with pytest.raises(RuntimeError, match=r"final parameters differ \(worker 1 against"):
        rejoin.check_one_model(params, group)
    del master


# ----------------------------------------------------------------- a server replaced


def test_a_replacement_server_counts_the_pushes_its_predecessor_died_with(
    tmp_path: Path,
) -> None:
    from dmlctl.ps.snapshots import Snapshots

    snapshots = Snapshots(str(tmp_path), 2, every=3)
    with pytest.raises(RuntimeError, match="no usable server snapshot"):
        snapshots.read()
    first = ParameterServer({0: torch.zeros(2)}, [0, 1], _Replies(), lr=1.0, elastic=True)
    assert snapshots.due(0)
    snapshots.write(first.state_dict(), 0)
    for n in range(1, 6):  # worker 0 pushes five times; a snapshot after the third
        first.handle(Message(Op.PUSH, 0, n, 0, torch.ones(2)))
        first.stats.total_pushes = n
        if snapshots.due(n):
            snapshots.write(first.state_dict(), n)
    assert not snapshots.due(5) and snapshots.due(6)
    state = Snapshots(str(tmp_path), 2, every=3).read()
    second = ParameterServer({0: torch.zeros(2)}, [0, 1], _Replies(), lr=1.0, elastic=True)
    second.load_state_dict(state)
    assert torch.equal(second.params[0], torch.full((2,), -3.0)) and state["total_pushes"] == 3
    second.handle(Message(Op.HELLO, 0, 0, -1, sent=5))  # it sent five: two died with the first
    second.handle(Message(Op.HELLO, 1, 0, -1, sent=0))
    assert second.pushes_lost == 2 and second.pushes_from == {0: 5, 1: 0}
    second.handle(Message(Op.PUSH, 0, 6, 0, torch.ones(2)))
    assert second.pushes_from[0] == 6 and second.state_dict()["pushes_lost"] == 2


def test_a_replacement_server_knows_the_workers_gone_and_waits_for_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Workers 1 (closed), 3 (gone: index 1 of workers 1, 3, 5) and 5: the replacement
    counts the first two as closed, and 5 as gone too unless it says HELLO within
    gone_after (it may have been lost while the old server was)."""
    from torch._C._distributed_c10d import TCPStore

    from dmlctl.ps import serve
    from dmlctl.ps.frames import closed_key

    store = TCPStore("127.0.0.1", 0, 1, True)
    monkeypatch.setattr(rejoin, "store", lambda: SignedStore(store))
    store.set(closed_key(1), '{"7": 4}')  # it sent server rank 7 four pushes
    store.set(rejoin.gone_key(1), "1")
    workers = [1, 3, 5]
    old = ParameterServer({0: torch.zeros(2)}, workers, _Replies(), lr=1.0, elastic=True)
    new = ParameterServer({0: torch.zeros(2)}, workers, _Replies(), lr=1.0, elastic=True)
    new.gone_after = 0.0
    old.pushes_from[1] = 3  # the snapshot has three of them
    serve._restore(new, old.state_dict(), 7)
    assert (new.closed, new.gone, set(new.away_since)) == ({1, 3}, {3}, {5})
    assert new.pushes_lost == 1  # the fourth died with the old server
    new.handle(Message(Op.HELLO, 5, 0, -1))  # in time: a worker
    new.drop_gone(time.monotonic())
    assert new.closed == {1, 3} and not new.away_since
    again = ParameterServer({0: torch.zeros(2)}, workers, _Replies(), lr=1.0, elastic=True)
    again.gone_after = 0.0
    serve._restore(again, old.state_dict(), 7)
    again.drop_gone(time.monotonic())  # never came
    assert again.closed == {1, 3, 5} and again.gone == {3, 5}


def test_a_worker_reconnects_to_the_servers_replacement(monkeypatch: pytest.MonkeyPatch) -> None:
    from dmlctl.ps import frames

    master = _master(monkeypatch)
    first = frames.Endpoint(2)
    frames.connection(0, 2, sent=0)
    assert first.get()[0][0] == Op.HELLO
    with pytest.raises(ConnectionLost, match="no replacement within"):
        frames.reconnect(0, 2, sent=4, timeout=0.2)  # the same server: not a new one
    first.close()
    second = frames.Endpoint(2)  # the replacement publishes generation 2
    conn = frames.reconnect(0, 2, sent=4)
    header, _, worker = second.get()
    assert (header[0], header[4], worker) == (Op.HELLO, 4, 0)  # HELLO says its pushes
    assert frames.connection(0, 2) is conn
    frames.disconnect(2)
    second.close()
    del master


# ----------------------------------------------------------------- local-sgd


def test_a_replacement_goes_on_at_its_peers_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dmlctl.runtime.cursor import DataCursor
    from dmlctl.runtime.metrics import MetricLogger

    monkeypatch.setenv(protocol.ENV_REJOIN, "1")

    def replacement(epoch: int, batches: int, taken: int, peers_step: int) -> DataCursor:
        rejoin.Position(str(tmp_path), 1).write(epoch, batches, taken)  # its predecessor's
        cursor = DataCursor(MetricLogger(1, None), position=rejoin.Position(str(tmp_path), 1))
        assert cursor.taken == taken
        cursor.go_on_at(peers_step)
        assert cursor.taken == peers_step and not cursor.started()
        return cursor

    # 640 samples, 2 workers, batches of 32: 10 batches an epoch.
    cursor = replacement(1, 3, 13, 16)  # three batches short of its peers' round
    assert cursor.begin(640, 2, 32, 3, False, 0) == 1 and cursor.skip == 6
    cursor = replacement(1, 8, 18, 24)  # the round was in the next epoch
    assert cursor.begin(640, 2, 32, 3, False, 0) == 2 and cursor.skip == 4
    # ssgd: the predecessor took a batch of the step its peers then did again without it
    cursor = replacement(1, 4, 14, 13)
    assert cursor.begin(640, 2, 32, 3, False, 0) == 1 and cursor.skip == 3
    cursor = replacement(2, 0, 20, 19)  # back over an epoch's start
    assert cursor.begin(640, 2, 32, 3, False, 0) == 1 and cursor.skip == 9


def test_only_a_broken_connection_makes_a_new_generation() -> None:
    from dmlctl.strategies.members import member_lost

    reset = "[pair.cc:537] Read error [127.0.0.1]:43706: Connection reset by peer"
    assert member_lost(RuntimeError(reset))
    assert member_lost(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:40088"))
    refused = "Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: SO_ERROR: "
    assert member_lost(RuntimeError(refused + "Connection refused"))  # died as it formed
    assert not member_lost(RuntimeError("Tensors must be contiguous"))


def _generation_one(
    monkeypatch: pytest.MonkeyPatch,
    members: list[dict[str, Any]],
    given: dict[int, Any] | None = None,
) -> dict[int, str]:
    """Two members (threads, a store client each) form generation 1, each with the
    given ``steps``, ``holding``, ``handover`` and ``last`` round; what each said
    ("formed" or the error); ``given``: the round result each was handed, if any."""
    import threading

    from torch._C._distributed_c10d import TCPStore

    from dmlctl.strategies.elastic import ElasticAverager

    server = TCPStore("127.0.0.1", 0, 1, True)
    mine = threading.local()  # a client each: one blocks while it waits for a key
    monkeypatch.setattr(rejoin, "store", lambda: SignedStore(mine.store))
    said: dict[int, str] = {}

    def member(rank: int) -> None:
        mine.store = TCPStore("127.0.0.1", server.port, is_master=False)
        averager = ElasticAverager(rank, 2, timedelta(seconds=30))
        how = members[rank]
        averager.generation, averager.steps = 1, lambda: how["steps"]
        averager.holding, averager.handover = how["holding"], how.get("handover")
        averager._last = how.get("last")
        try:
            averager._form()
            said[rank] = "formed"
            if given is not None and averager._given is not None:
                given[rank] = averager._given
        except RuntimeError as exc:
            said[rank] = str(exc)

    threads = [threading.Thread(target=member, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return said


def test_a_member_left_inside_a_round_the_others_completed_is_handed_its_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker lost inside the round of step 40 that rank 1 completed (it went on to
    48) and rank 0 did not: rank 0 is handed rank 1's result of that round, which its
    round returns instead of running again (rank 0 then meets rank 1 at 48)."""
    result = (torch.arange(5.0), torch.tensor([2.0, 80.0]))
    given: dict[int, Any] = {}
    said = _generation_one(
        monkeypatch,
        [
            {"steps": 40, "holding": True, "last": (32, torch.zeros(5))},
            {"steps": 48, "holding": True, "last": (40, result)},
        ],
        given,
    )
    assert said == {0: "formed", 1: "formed"}, said
    assert list(given) == [0] and given[0][0] == 40
    assert all(torch.equal(a, b) for a, b in zip(given[0][1], result, strict=True))

    from dmlctl.strategies.elastic import ElasticAverager

    averager = ElasticAverager.__new__(ElasticAverager)
    averager._given, averager._last = given[0], None
    ran: list[int] = []
    out = averager.rounds(lambda: ran.append(1), step=40)
    assert ran == [] and torch.equal(out[0], result[0])  # the round is not run again
    assert averager._last is not None and averager._last[0] == 40  # to hand on in turn


def test_members_at_different_steps_are_not_joined_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Members at different steps otherwise (the one ahead did not complete the round
    the other is in): the next generation says so instead of going on (or hanging)."""
    said = _generation_one(
        monkeypatch,
        [
            {"steps": 40, "holding": True, "last": (32, torch.zeros(1))},
            {"steps": 48, "holding": True, "last": (32, torch.zeros(1))},
        ],
    )
    message = "generation 1: the workers are at different steps (rank 0: 40, rank 1: 48)"
    assert said[0].startswith(message) and said[1] == said[0], said


def test_a_replacement_is_handed_a_state_of_any_size_over_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dmlctl.strategies.elastic_start import Handover

    big = torch.arange(3 * 2**20, dtype=torch.float32)  # 12 MiB: more than a store value
    got: list[dict[str, Any]] = []
    donor = Handover(lambda: {"w": big, "step": 7}, got.append, "state")
    taker = Handover(dict, got.append, "state")
    said = _generation_one(
        monkeypatch,
        [
            {"steps": 7, "holding": True, "handover": donor},
            {"steps": 0, "holding": False, "handover": taker},
        ],
    )
    assert said == {0: "formed", 1: "formed"}, said
    (state,) = got  # the replacement's only
    assert state["step"] == 7 and torch.equal(state["w"], big)


def _master(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A TCPStore master of this process on a port it bound itself (no other process
    can take it first), with MASTER_ADDR and MASTER_PORT set to it."""
    from torch._C._distributed_c10d import TCPStore

    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(master.port))
    return master


def _store(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A store of this process (the run's, as ranks reach it: MASTER_ADDR/PORT set)."""
    from torch._C._distributed_c10d import PrefixStore

    master = _master(monkeypatch)
    monkeypatch.setattr(rejoin, "_store", None)
    return PrefixStore(rejoin.STORE_PREFIX, master)


def test_a_position_on_a_lost_host_is_read_from_the_stores_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replacement on another host finds no file: the copy in the run's store
    (written at most every MIRROR_S, so a second's batches may be taken again)."""
    kept = _store(monkeypatch)  # the server lives as long as this
    lost, elsewhere = tmp_path / "lost", tmp_path / "spare"
    lost.mkdir()
    elsewhere.mkdir()
    position = rejoin.Position(str(lost), 3)
    position.write(1, 5, 105)  # copied (the first write always is)
    position.write(1, 6, 106)  # within MIRROR_S: the file only
    assert rejoin.Position(str(elsewhere), 3).read() == (1, 5, 105)
    assert rejoin.Position(str(lost), 3).read() == (1, 6, 106)  # the newer of both
    assert kept.check([rejoin.key("position/3")])


def test_torchrun_of_an_in_place_run_waits_at_exit_for_every_ranks_done_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not for every node (a node replaced in place never gets there): for the done key
    of each rank of the world, whichever process runs it; bounded."""
    from types import SimpleNamespace

    from dmlctl.agent.elastic_agent import wait_for_ranks

    store = _store(monkeypatch)
    group: Any = SimpleNamespace(
        master_addr="127.0.0.1",
        master_port=int(os.environ["MASTER_PORT"]),
        workers=[SimpleNamespace(world_size=2)],
        group_rank=1,
        group_world_size=2,
    )
    store.set(rejoin.done_key(0), "1")
    wait_for_ranks(group, linger=True, timeout=0.5, reach=0.5)
    assert "not every rank said it is done with the store" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "1")
    rejoin.done()  # rank 1, from wherever it runs now
    wait_for_ranks(group, linger=True, timeout=0.5, reach=0.5)
    assert capsys.readouterr().err == ""
    # The store's torchrun ended first (every rank was done): no 5-minute retry.
    gone: Any = SimpleNamespace(**{**vars(group), "master_port": _free_port()})
    started = time.monotonic()
    wait_for_ranks(gone, linger=True, timeout=0.5, reach=0.5)
    assert time.monotonic() - started < 10 and capsys.readouterr().err == ""


def test_the_others_go_on_without_a_worker_no_replacement_came_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """restart.rejoin_wait: workers 0 and 1 form generation 1 without worker 2 after
    the wait (it is gone: the store collectives and torchrun stop waiting for it) and
    average over the two of them; worker 2 coming back later is let in again at the
    next generation."""
    import threading

    from torch._C._distributed_c10d import TCPStore

    from dmlctl.runtime.optimizer import CommMeter
    from dmlctl.strategies import members
    from dmlctl.strategies.elastic import ElasticAverager

    server = TCPStore("127.0.0.1", 0, 1, True)
    mine = threading.local()
    monkeypatch.setattr(rejoin, "store", lambda: SignedStore(mine.store))
    means: dict[int, float] = {}

    def member(rank: int) -> None:
        mine.store = TCPStore("127.0.0.1", server.port, is_master=False)
        averager = ElasticAverager(rank, 3, timedelta(seconds=30), wait=0.3)
        averager.generation = 1
        averager._form()
        mean, _ = averager.average([torch.full((2,), float(rank))], 5, CommMeter())
        means[rank] = float(mean[0])
        assert averager.members == (0, 1)

    threads = [threading.Thread(target=member, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert means == {0: 0.5, 1: 0.5}
    client = TCPStore("127.0.0.1", server.port, is_master=False)
    mine.store = client
    assert client.check([rejoin.gone_key(2)])  # the store collectives stop waiting for it
    assert client.check([rejoin.done_key(2)])  # and torchrun at its exit
    for rank in (0, 1):  # the others, in generation 2 as worker 2 comes back
        client.set(rejoin.key(f"elastic/2/in/{rank}"), "1")
    assert members.agree(client, 2, 2, 3, 30.0) == (0, 1, 2)  # back: a member again
    assert not client.check([rejoin.gone_key(2)])


def test_dpsgd_left_smaller_mixes_over_the_ring_closed_around_the_gap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """dpsgd on a ring of 3 whose worker 2 never came back: workers 0 and 1 form
    generation 1 without it and mix over a ring of two (weights 1/2 each, not the
    3-ring's 1/3 with a neighbour missing), so both hold the mean; the consensus is
    over the two and so is the final average."""
    import threading

    from torch._C._distributed_c10d import TCPStore

    from dmlctl.strategies.dpsgd.in_place import ElasticGossip
    from dmlctl.strategies.dpsgd.params import Params
    from dmlctl.strategies.elastic import ElasticAverager

    server = TCPStore("127.0.0.1", 0, 1, True)
    mine = threading.local()
    monkeypatch.setattr(rejoin, "store", lambda: SignedStore(mine.store))
    seen: dict[int, tuple[list[int], float, float, float]] = {}

    def member(rank: int) -> None:
        mine.store = TCPStore("127.0.0.1", server.port, is_master=False)
        weight = torch.nn.Parameter(torch.full((2,), float(3 * rank)))
        inner = torch.optim.SGD([weight], lr=0.1)
        opt = ElasticGossip(inner, [weight], rank=rank, world_size=3, settings=Params())
        assert opt.peers == [1, 2] if rank == 0 else [0, 2]  # the 3-ring, before
        opt.elastic = ElasticAverager(rank, 3, timedelta(seconds=30), wait=0.3)
        opt.elastic.generation = 1
        opt.elastic._form()
        opt.mix()
        mixed = float(weight.detach()[0])
        weight.data.add_(float(rank))  # apart again: 1.5 and 2.5 (mean 2)
        distance = opt.consensus()
        opt.final_model()
        seen[rank] = ([opt.graph[j] for j in opt.peers], mixed, distance, float(weight.detach()[0]))

    threads = [threading.Thread(target=member, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert seen[0] == ([1], 1.5, pytest.approx(0.5**0.5), 2.0), seen  # sqrt(mean of 2 × 0.25)
    assert seen[1] == ([0], 1.5, pytest.approx(0.5**0.5), 2.0), seen
