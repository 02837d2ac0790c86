"""Round-based parameter servers (:mod:`dmlctl.ps.rounds`) on an in-memory transport:
when a round closes, what it applies, which reads wait, what is dropped and counted
— without processes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dmlctl.ps.channel import Message, Op
from dmlctl.ps.rounds import BackupRounds, ConsensusRounds, RoundServer, make_optimizer
from dmlctl.ps.serve import make_round_rule


class Replies:
    """A :class:`~dmlctl.ps.channel.ServerTransport` that records the replies."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int, torch.Tensor]] = []  # (worker, version, flat)

    def receive(self, timeout: float | None = None) -> Message | None:
        raise AssertionError("the tests hand messages to handle() directly")

    def reply(
        self, worker: int, shard_id: int, version: int, flat: torch.Tensor, min_clock: int
    ) -> None:
        del shard_id, min_clock
        self.sent.append((worker, version, flat.clone()))

    def send_blob(self, worker: int, blob: bytes) -> None:
        del worker, blob

    def to(self, worker: int) -> list[int]:
        return [v for w, v, _ in self.sent if w == worker]


def push(worker: int, tag: int, values: list[float], pull: bool = True) -> Message:
    return Message(Op.PUSH, worker, tag, 0, torch.tensor(values), then_pull=pull)


def sgd_server(backup: int, workers: int = 3, **settings: Any) -> tuple[RoundServer, Replies]:
    replies = Replies()
    rule = BackupRounds(workers, backup, "SGD", {"lr": 0.5, **settings})
    server = RoundServer({0: torch.zeros(2)}, range(workers), replies, rule=rule)
    return server, replies


def test_backup_rounds_step_on_the_mean_once_k_minus_b_are_in() -> None:
    server, replies = sgd_server(backup=1)
    server.handle(push(0, 0, [1.0, 2.0]))
    assert replies.sent == [] and server.versions[0] == 0  # 1 of the 2 needed
    server.handle(push(2, 0, [3.0, 4.0]))
    assert server.versions[0] == 1
    assert torch.equal(server.params[0], torch.tensor([-1.0, -1.5]))  # −0.5 · mean
    assert replies.to(0) == replies.to(2) == [1]  # both waiting reads answered
    server.handle(push(1, 0, [100.0, 100.0]))  # late: its round is over
    assert torch.equal(server.params[0], torch.tensor([-1.0, -1.5]))
    assert replies.to(1) == [1]  # answered at once with the newest parameters
    assert server.rounds_rule.metrics() == {"dropped": 1.0, "rounds": 1.0}
    assert isinstance(server.rounds_rule, BackupRounds)
    assert server.rounds_rule.dropped_by == {1: 1}


def test_backup_rounds_without_backups_wait_for_every_worker_still_training() -> None:
    server, replies = sgd_server(backup=0)
    server.handle(push(0, 0, [1.0, 1.0]))
    server.handle(push(1, 0, [1.0, 1.0]))
    assert server.versions[0] == 0
    server.handle(Message(Op.DONE, 2, 5, -1))  # worker 2's data ran out
    assert server.versions[0] == 1 and replies.to(0) == replies.to(1) == [1]


def test_backup_rounds_run_the_users_optimizer_with_its_state() -> None:
    server, _ = sgd_server(backup=0, workers=1, momentum=0.9)
    for tag in range(3):
        server.handle(push(0, tag, [1.0, 0.0]))
    reference = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([reference], lr=0.5, momentum=0.9)
    for _ in range(3):
        reference.grad = torch.tensor([1.0, 0.0])
        opt.step()
    assert torch.allclose(server.params[0], reference.detach())
    state = server.state_dict()
    fresh, _ = sgd_server(backup=0, workers=1, momentum=0.9)
    fresh.load_state_dict(state)
    fresh.handle(push(0, 3, [1.0, 0.0]))
    reference.grad = torch.tensor([1.0, 0.0])
    opt.step()  # the momentum buffer travelled with the state
    assert torch.allclose(fresh.params[0], reference.detach())


def test_backup_rounds_refuse_as_many_backups_as_workers() -> None:
    with pytest.raises(ValueError, match=r"backup workers must be in \[0, 2\)"):
        BackupRounds(2, 2, "SGD", {"lr": 0.1})
    with pytest.raises(ValueError, match="no optimizer 'Nope'"):
        make_optimizer("Nope", torch.zeros(1), {})


def consensus_server(k0: int, tau: int) -> tuple[RoundServer, Replies]:
    replies = Replies()
    rule = make_round_rule({"kind": "consensus", "min_workers": k0, "max_delay": tau}, [0, 1, 2])
    server = RoundServer({0: torch.zeros(2)}, [0, 1, 2], replies, rule=rule)
    return server, replies


def test_consensus_z_is_the_mean_of_every_workers_latest_report() -> None:
    server, replies = consensus_server(k0=2, tau=3)
    server.handle(push(0, 0, [3.0, 0.0]))
    assert server.versions[0] == 0
    server.handle(push(1, 0, [0.0, 3.0]))
    # worker 2 has not reported: its v is z₀ = 0
    assert torch.equal(server.params[0], torch.tensor([1.0, 1.0]))
    assert replies.to(0) == replies.to(1) == [1]
    server.handle(push(2, 0, [3.0, 3.0]))  # late, but kept as worker 2's latest v
    assert replies.to(2) == []  # waits for the update that includes it
    server.handle(push(0, 1, [6.0, 0.0]))
    assert torch.equal(server.params[0], torch.tensor([3.0, 2.0]))  # (6+0+3, 0+3+3)/3
    assert replies.to(2) == [2]


def test_consensus_waits_for_a_worker_whose_delay_reached_tau() -> None:
    server, _ = consensus_server(k0=1, tau=2)
    rule = server.rounds_rule
    assert isinstance(rule, ConsensusRounds)
    for tag in range(2):  # worker 0 alone: workers 1 and 2 miss two updates
        server.handle(push(0, tag, [1.0, 1.0]))
    assert server.versions[0] == 2 and rule.delays[0] == {0: 0, 1: 2, 2: 2}
    server.handle(push(0, 2, [1.0, 1.0]))
    assert server.versions[0] == 2  # 1 and 2 are at τ: they are waited for
    server.handle(push(1, 0, [1.0, 1.0]))
    assert server.versions[0] == 2
    server.handle(push(2, 0, [1.0, 1.0]))
    assert server.versions[0] == 3 and rule.worst_delay == 2
    assert rule.metrics()["delay_max"] == 2.0


def test_consensus_state_round_trip() -> None:
    server, _ = consensus_server(k0=1, tau=2)
    server.handle(push(0, 0, [2.0, 2.0]))
    fresh, _ = consensus_server(k0=1, tau=2)
    fresh.load_state_dict(server.state_dict())
    fresh.handle(push(1, 0, [5.0, 5.0]))
    assert torch.equal(fresh.params[0], torch.tensor([7 / 3, 7 / 3]))  # (2 + 5 + 0) / 3


def test_backup_rounds_step_with_the_lr_the_workers_sent() -> None:
    server, _ = sgd_server(backup=0, workers=1)  # lr 0.5 at start
    server.handle(Message(Op.PUSH, 0, 0, 0, torch.tensor([1.0, 1.0]), then_pull=True, lr=0.1))
    assert torch.allclose(server.params[0], torch.tensor([-0.1, -0.1]))
    server.handle(push(0, 1, [1.0, 1.0]))  # no lr sent: the last one stays
    assert torch.allclose(server.params[0], torch.tensor([-0.2, -0.2]))


def final_pull(worker: int) -> Message:
    return Message(Op.PULL, worker, 9, 0, final=True)


@pytest.mark.parametrize("kind", ["asgd", "sync-ps"])
def test_a_final_pull_is_answered_once_every_worker_said_done(kind: str) -> None:
    """The end of the data: the workers meet at the servers (no barrier of their own)."""
    from dmlctl.ps.server import ParameterServer

    replies = Replies()
    server: ParameterServer
    if kind == "asgd":
        server = ParameterServer({0: torch.zeros(2)}, range(2), replies, lr=0.1)
    else:
        server, replies = sgd_server(backup=0, workers=2)
    server.handle(Message(Op.DONE, 0, 9, -1))
    server.handle(final_pull(0))
    server.handle(Message(Op.PULL, 1, 3, 0))  # an ordinary read is not held
    assert replies.to(0) == [] and len(replies.to(1)) == 1
    server.handle(Message(Op.DONE, 1, 9, -1))
    assert len(replies.to(0)) == 1  # answered the moment the last worker is done
    server.handle(final_pull(1))
    assert len(replies.to(1)) == 2


def test_a_replacement_sync_ps_server_goes_on_from_its_snapshots_round() -> None:
    """A server replaced in place from a snapshot taken at version 1 while the workers
    were at version 3: their pushes tagged 3 are dropped and answered at once with
    the snapshot's parameters (not held for a round nobody will push for), and the
    rounds go on from version 1; every push is counted as its worker's."""
    old, _ = sgd_server(backup=0, workers=2)
    old.handle(push(0, 0, [1.0, 1.0]))
    old.handle(push(1, 0, [1.0, 1.0]))
    snapshot = old.state_dict()  # version 1
    new, replies = sgd_server(backup=0, workers=2)
    new.load_state_dict(snapshot)
    assert new.versions[0] == 1 and new.pushes_from == {0: 1, 1: 1}
    new.handle(push(0, 3, [5.0, 5.0]))  # sent to the dead server's replacement
    assert replies.to(0) == [1] and new.versions[0] == 1  # answered at once, dropped
    assert torch.equal(replies.sent[0][2], snapshot["params"][0])
    new.handle(push(0, 1, [1.0, 1.0]))
    new.handle(push(1, 1, [3.0, 3.0]))
    assert new.versions[0] == 2 and replies.to(0) == [1, 2] and replies.to(1) == [2]
    assert new.pushes_from == {0: 3, 1: 2}
