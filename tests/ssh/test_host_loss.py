"""Losing a host mid-run, on real sshd hosts: the run goes on with the hosts left
(``min_hosts``), from the checkpoint the controller kept, or fails clearly."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.procs import run_processes, wait_until
from tests.integration.test_parameter_servers import EXAMPLE, UNINTERRUPTED, _final, _metrics
from tests.ssh.lab import SILENCE_S, SshLab, start_lab
from tests.ssh.test_remote import LabCli, cluster_file

ELASTIC = Path(__file__).parent / "jobs" / "elastic"
EVALUATES = Path(__file__).parent / "jobs" / "evaluates"
pytestmark = pytest.mark.ssh


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[SshLab]:
    """A lab of this test's own: its hosts get killed."""
    with start_lab(tmp_path / "lab", n_hosts=2, agent_server_idle=0) as lab:
        yield lab


def _job(tmp_path: Path, extra: str, restart: str = "") -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: elastic\nscript: train.py\nworkdir: {ELASTIC}\nworkers: 2\n"
        f"env:\n  OUT: {tmp_path / 'out.txt'}\n"
        "checkpoint:\n  every_steps: 5\n"
        "restart:\n  max_infra_restarts: 2\n  backoff_initial: 0.2\n"
        "  host_wait: 3\n  host_cooldown: 60\n  stop_grace: 1\n" + restart + extra
    )
    return job


def _run_until_copied(
    cli: LabCli,
    lab: SshLab,
    tmp_path: Path,
    extra: str,
    *,
    freeze: bool = False,
    timeout: str = "",
) -> tuple[str, float]:
    """Launch on both hosts (one worker each), wait until the controller holds a
    checkpoint copy, then kill node-a (the rendezvous host) — or freeze it, a host cut
    off — and wait until the controller has noticed (a restart): returns (run, seconds
    from the fault to that)."""
    cluster = cluster_file(lab, tmp_path, **{h.alias: "slots: 1" for h in lab.hosts})
    proc = cli.popen(
        "launch", str(_job(tmp_path, extra, timeout)), "--cluster", str(cluster), "--ui", "plain"
    )
    if not wait_until(lambda: len(cli.runs()) == 1 or proc.poll() is not None, 60):
        proc.kill()
    assert len(cli.runs()) == 1, proc.communicate()[0]
    run_id = cli.runs()[0].name
    latest = cli.home / "runs" / run_id / "checkpoints" / "LATEST"
    assert wait_until(latest.is_file, 90), "the controller never got a checkpoint copy"
    killed = time.monotonic()
    if freeze:
        lab.freeze_host("node-a")
    else:
        lab.kill_host("node-a")
    noticed = wait_until(lambda: cli.state(run_id)["restarts"] >= 1, 30)
    took = time.monotonic() - killed
    cli.proc = proc  # type: ignore[attr-defined]
    assert noticed, "the lost host was never noticed"
    return run_id, took


def test_a_lost_host_is_replaced_by_the_hosts_left(lab: SshLab, tmp_path: Path) -> None:
    cli = LabCli(tmp_path / "home", lab)
    run_id, took = _run_until_copied(cli, lab, tmp_path, "min_hosts: 1\n")
    assert took < 15, took  # the connection closes: noticed at once, restarted after
    out, _ = cli.proc.communicate(timeout=120)  # type: ignore[attr-defined]
    assert cli.proc.returncode == 0, out  # type: ignore[attr-defined]
    state = cli.state(run_id)
    lost = state["failures"][0]
    assert (lost["host"], lost["exc_type"]) == ("node-a", "AgentLost"), lost
    assert state["hosts"] == ["node-b"] and state["world_size"] == 1
    # node-b had only rank 1's files; rank 0 of the smaller world needs rank-0.pt,
    # which only the controller's copy could hand it.
    starts = [line for line in out.splitlines() if "attempt 2 starts at step" in line]
    assert starts and "rank 0 of 1" in starts[0], out
    assert int(starts[0].rsplit(" ", 1)[1]) >= 5, starts
    assert "was saved by 2 ranks; rank 0 of 1 resumes from rank-0.pt" in out, out
    assert (tmp_path / "out.txt").read_text().startswith("40 ")
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)


def test_too_few_hosts_left_fails_clearly_without_hanging(lab: SshLab, tmp_path: Path) -> None:
    cli = LabCli(tmp_path / "home", lab)
    started = time.monotonic()
    run_id, _ = _run_until_copied(cli, lab, tmp_path, "")
    out, _ = cli.proc.communicate(timeout=120)  # type: ignore[attr-defined]
    took = time.monotonic() - started
    assert cli.proc.returncode == 1, out  # type: ignore[attr-defined]
    cause = cli.state(run_id)["root_cause"]
    assert cause["exc_type"] == "HostsLost", cause
    assert "node-a" in cause["message"] and "min_hosts" in cause["message"], cause
    assert took < 120, took  # host_wait 3 s: never a collective timeout
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)
    summary = json.loads((cli.home / "runs" / run_id / "summary.json").read_text())
    assert summary


def test_a_host_cut_off_is_noticed_by_its_silence(lab: SshLab, tmp_path: Path) -> None:
    """node-a stops answering but its connection stays open (SIGSTOP of everything
    there): noticed within host_timeout (:data:`SILENCE_S` here) plus the attempt's
    teardown, and the run goes on with node-b alone."""
    cli = LabCli(tmp_path / "home", lab)
    try:
        run_id, took = _run_until_copied(
            cli,
            lab,
            tmp_path,
            "min_hosts: 1\n",
            freeze=True,
            timeout=f"  host_timeout: {SILENCE_S}\n",
        )
        assert took < SILENCE_S + 12, took
        out, _ = cli.proc.communicate(timeout=120)  # type: ignore[attr-defined]
        assert cli.proc.returncode == 0, out  # type: ignore[attr-defined]
        state = cli.state(run_id)
        lost = state["failures"][0]
        assert (lost["host"], lost["exc_type"]) == ("node-a", "AgentLost"), lost
        assert f"no message from the host for {SILENCE_S} s" in lost["message"], lost
        assert state["hosts"] == ["node-b"]
        # The end does not wait on the lost host's timeout to collect its files.
        assert "rank files of node-a not collected: the host was lost" in out, out
        assert "could not collect rank files" not in out, out
        assert (tmp_path / "out.txt").read_text().startswith("40 ")
    finally:
        lab.kill_host("node-a")
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)


def _in_place_run(
    cli: LabCli,
    lab: SshLab,
    tmp_path: Path,
    strategy: str,
    fault: Callable[[str], None],
    restart: str = "",
    job_extra: str = "",
    layout: str | None = None,
    slots: dict[str, int] | None = None,
) -> tuple[str, str]:
    """Launch ``strategy`` with restart.mode: in_place (and ``restart``, ``job_extra``)
    on node-a and node-b (one worker each, asgd's server on node-a; max_hosts: 2
    without servers: a third host is a spare) — or as ``layout`` and ``slots`` say —
    call ``fault(run_id)`` once the workers have trained a while (each step paced to
    5 ms: unpaced, the steps left after step 100 take half a second, less than a busy
    machine may take to act); returns (run id, the launch's output) of the run, which
    must succeed."""
    slots = slots or {}
    cluster = cluster_file(
        lab, tmp_path, **{h.alias: f"slots: {slots.get(h.alias, 1)}" for h in lab.hosts}
    )
    if layout is None:
        layout = "parameter_servers: 1\n" if strategy == "asgd" else "max_hosts: 2\n"
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: hostswap\nworkdir: {EXAMPLE}\nscript: train.py\n"
        "args: ['--epochs', '3', '--step-sleep', '0.005']\n"
        f"workers: 2\nstrategy: {strategy}\nrestart: {{mode: in_place{restart}}}\n"
        + layout
        + job_extra
    )
    proc = cli.popen("launch", str(job), "--cluster", str(cluster), "--ui", "plain")

    def training() -> bool:
        runs = cli.runs()
        ranks = cli.state(runs[0].name)["ranks"] if runs else []
        return proc.poll() is not None or any((r["step"] or 0) >= 100 for r in ranks)

    assert wait_until(training, 120), "the run never trained"
    assert cli.runs(), proc.communicate()[0]
    run_id = cli.runs()[0].name
    fault(run_id)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    return run_id, out


def _replaced(cli: LabCli, run_id: str, out: str, to: str, strategy: str) -> None:
    """node-b's worker went on on ``to`` while node-a's ranks went on: one failure
    counted, the accuracy of an uninterrupted run, no process left."""
    state = cli.state(run_id)
    hosts = {r["rank"]: r["host"] for r in state["ranks"]}
    moved = [rank for rank, host in hosts.items() if host == to]
    stayed = [rank for rank, host in hosts.items() if host == "node-a"]
    assert len(moved) == 1 and len(stayed) == len(hosts) - 1, hosts
    assert "node-b lost (" in out and f"rank {moved[0]} starts again on {to}" in out, out
    rejoined = "rejoined: model from server" if strategy == "asgd" else "rejoined at step"
    assert f"rank {moved[0]} {rejoined}" in out, out
    assert (state["restarts"], state["respawns"]) == (0, 1), state
    assert state["failures"][0]["host"] == "node-b", state["failures"]
    files = cli.home / "runs" / run_id / "hosts"
    for rank in stayed:  # they went on: never started again
        events = (files / "node-a" / f"rank-{rank}.events.jsonl").read_text()
        assert events.count('"kind":"start"') == 1, rank
    assert (files / to / "rejoin-1" / f"rank-{moved[0]}.events.jsonl").is_file()
    steps = {r["rank"]: r["step"] for r in state["ranks"] if r["role"] == "worker"}
    assert len(set(steps.values())) == 1, steps  # the replacement took the batches left
    accuracy = _final(cli, run_id)["test_acc"]
    assert accuracy >= UNINTERRUPTED[strategy] - 0.015, accuracy
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)


@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_a_lost_host_is_replaced_in_place_by_a_spare(tmp_path: Path, fault: str) -> None:
    """restart.mode: in_place under local-sgd, node-c a spare: node-b dies mid-run (or
    is cut off: its connection stays open, its rank stays in the collective); its rank
    starts on node-c and joins its peer, which never restarts."""
    with start_lab(tmp_path / "lab", n_hosts=3, agent_server_idle=0) as lab:
        cli = LabCli(tmp_path / "home", lab)

        def act(run_id: str) -> None:
            (lab.kill_host if fault == "kill" else lab.freeze_host)("node-b")

        try:
            run_id, out = _in_place_run(
                cli,
                lab,
                tmp_path,
                "local-sgd",
                act,
                f", host_timeout: {SILENCE_S}" if fault == "freeze" else "",
            )
        finally:
            lab.kill_host("node-b")
        _replaced(cli, run_id, out, "node-c", "local-sgd")
        assert "rank files of node-b not collected: the host was lost" in out, out
        if fault == "freeze":
            assert f"node-b lost (no message from the host for {SILENCE_S} s" in out, out


@pytest.mark.parametrize("closed", [False, True], ids=["evaluating", "part-over"])
def test_a_host_lost_after_training_ends_its_rank_or_restarts_the_run(
    tmp_path: Path, closed: bool
) -> None:
    """restart.mode: in_place under local-sgd, node-c a spare: node-a dies while rank 0
    runs its code after training (an evaluation) and rank 1 has ended. Rank 0's
    replacement on node-c finds every other worker finished, no round left to join:
    its predecessor's script not ended, the run restarts as a whole (as on a worker's
    own host) and rank 0's evaluation runs there; ended (``ctx.close()`` first), the
    replacement ends as finished and the run succeeds without a restart — at once
    either way, not after rejoin_wait and a "no worker holds the model" failure."""
    mark = tmp_path / "mark"
    with start_lab(tmp_path / "lab", n_hosts=3, agent_server_idle=0) as lab:
        cli = LabCli(tmp_path / "home", lab)
        cluster = cluster_file(lab, tmp_path, **{h.alias: "slots: 1" for h in lab.hosts})
        job = tmp_path / "job.yaml"
        job.write_text(
            f"name: lateloss\nworkdir: {EVALUATES}\nscript: train.py\nworkers: 2\n"
            "strategy: local-sgd\nrestart: {mode: in_place, backoff_initial: 0.2}\n"
            f"max_hosts: 2\nenv:\n  MARK: {mark}\n  CLOSE_FIRST: '{int(closed)}'\n"
        )
        proc = cli.popen("launch", str(job), "--cluster", str(cluster), "--ui", "plain")
        try:
            assert wait_until(mark.exists, 120), proc.poll()
            run_id = cli.runs()[0].name
            ended = lambda: cli.state(run_id)["ranks"][1]["status"] == "succeeded"  # noqa: E731
            assert wait_until(ended, 30), cli.state(run_id)["ranks"]
            lab.kill_host("node-a")
            out, _ = proc.communicate(timeout=120)
        finally:
            proc.kill()
            lab.kill_host("node-a")
    assert proc.returncode == 0, out
    assert "rank 0 starts again on node-c" in out, out
    state = cli.state(run_id)
    if closed:
        assert "part of the run was over" in out and "counted as finished" in out, out
        assert state["restarts"] == 0, state["failures"]
        return
    assert "LostAfterTraining: rank 0 was lost after its training was over" in out, out
    assert "a replacement cannot rejoin a finished training" in out, out
    assert state["failures"][0]["exc_type"] == "AgentLost", state["failures"]  # the root
    assert state["restarts"] == 1 and "rank 0 evaluated" in out, out


def test_rank_0s_host_is_replaced_in_place_by_a_spare(tmp_path: Path) -> None:
    """restart.mode: in_place under local-sgd, node-c a spare: node-a, the host of rank
    0 (whose torchrun would serve the run's store: here the controller holds it), dies
    mid-run; rank 0 starts on node-c, takes its state from rank 1 and the run ends
    without a restart, at the accuracy of an uninterrupted run."""
    with start_lab(tmp_path / "lab", n_hosts=3, agent_server_idle=0) as lab:
        cli = LabCli(tmp_path / "home", lab)
        try:
            run_id, out = _in_place_run(
                cli, lab, tmp_path, "local-sgd", lambda _: lab.kill_host("node-a")
            )
        finally:
            lab.kill_host("node-a")
    assert "the run's store, held by this controller" not in out  # said by the dry run only
    assert "node-a lost (" in out and "rank 0 starts again on node-c" in out, out
    assert "rank 0 rejoined at step" in out and "from rank 1" in out, out
    state = cli.state(run_id)
    assert (state["restarts"], state["respawns"]) == (0, 1), state["failures"]
    hosts = {r["rank"]: (r["host"], r["status"]) for r in state["ranks"]}
    assert hosts == {0: ("node-c", "succeeded"), 1: ("node-b", "succeeded")}, hosts
    events = (cli.home / "runs" / run_id / "hosts" / "node-b" / "rank-1.events.jsonl").read_text()
    assert events.count('"kind":"start"') == 1  # rank 1 went on: never started again
    steps = {r["step"] for r in state["ranks"]}
    assert len(steps) == 1, steps
    assert _final(cli, run_id)["test_acc"] >= UNINTERRUPTED["local-sgd"] - 0.015
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)


@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_a_lost_server_host_is_replaced_in_place_by_a_spare(tmp_path: Path, fault: str) -> None:
    """asgd, both workers on node-a, the server alone on node-b, node-c a spare: node-b
    dies mid-run (or freezes: the workers' sockets to its server stay open); the server
    starts on node-c from its newest snapshot, read from the run's store (node-b's disk
    went with it), the workers leave the old one for it and go on without a restart;
    the pushes since the snapshot are counted lost."""
    with start_lab(tmp_path / "lab", n_hosts=3, agent_server_idle=0) as lab:
        cli = LabCli(tmp_path / "home", lab)
        layout = "parameter_servers: 1\nserver_hosts: [node-b]\nmax_hosts: 2\n"
        try:
            run_id, out = _in_place_run(
                cli,
                lab,
                tmp_path,
                "asgd",
                lambda _: (lab.kill_host if fault == "kill" else lab.freeze_host)("node-b"),
                ", ps_snapshot_every: 100"
                + (f", host_timeout: {SILENCE_S}" if fault == "freeze" else ""),
                layout=layout,
                slots={"node-a": 2},
            )
        finally:
            lab.kill_host("node-b")
    assert "node-b lost (" in out and "rank 2 starts again on node-c" in out, out
    if fault == "freeze":
        assert f"node-b lost (no message from the host for {SILENCE_S} s" in out, out
    state = cli.state(run_id)
    assert (state["restarts"], state["respawns"]) == (0, 1), state
    hosts = {r["rank"]: (r["host"], r["role"], r["status"]) for r in state["ranks"]}
    assert hosts == {
        0: ("node-a", "worker", "succeeded"),
        1: ("node-a", "worker", "succeeded"),
        2: ("node-c", "server", "succeeded"),
    }, hosts
    steps = {r["rank"]: r["step"] for r in state["ranks"]}
    lost = [m["values"]["pushes_lost"] for m in _metrics(cli, run_id) if m["rank"] == 2]
    assert lost and 0 <= lost[-1] <= 100 + 2, lost  # since the snapshot, and in flight
    assert steps[2] + lost[-1] == steps[0] + steps[1], (steps, lost)
    accuracy = _final(cli, run_id)["test_acc"]
    assert accuracy >= UNINTERRUPTED["asgd"] - 0.015, accuracy
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)


def test_a_host_whose_agent_died_takes_its_ranks_again_in_place(
    lab: SshLab, tmp_path: Path
) -> None:
    """asgd, its server on node-a, no spare: node-b's agent is killed (its worker
    dies with it) but the machine answers; the worker starts there again, takes the
    server's model and its data where its predecessor was (the run's store kept it),
    while the other worker and the server go on."""
    cli = LabCli(tmp_path / "home", lab)

    def kill_agent(run_id: str) -> None:
        found = list(lab.host("node-b").workdir.glob(f"**/{run_id}/node-b/agent.pid"))
        assert found, "no agent.pid on node-b"
        os.kill(int(found[0].read_text()), signal.SIGKILL)

    run_id, out = _in_place_run(cli, lab, tmp_path, "asgd", kill_agent)
    _replaced(cli, run_id, out, "node-b", "asgd")


# admm: the averaging strategy whose rounds carry more than the model (z, the duals);
# asgd: the server counts the lost worker gone. bmuf, easgd and dpsgd go on smaller too
# (checked by hand, accuracy as uninterrupted; dpsgd's ring laid again over the workers
# left: tests/unit/test_in_place.py).
@pytest.mark.parametrize("strategy", ["local-sgd", "admm", "asgd"])
def test_with_no_host_to_take_them_the_others_go_on_without_a_lost_hosts_ranks(
    lab: SshLab, tmp_path: Path, strategy: str
) -> None:
    """min_hosts: 1, no spare: node-b dies and cannot take its rank back; after
    restart.rejoin_wait (1 s) rank 0 goes on alone, averaging over itself (asgd: its
    server, rank 1 on node-a, goes on without worker rank 2), and the run succeeds
    without a restart, node-b's rank `dropped`; status lists the loss, no failed
    attempt."""
    cli = LabCli(tmp_path / "home", lab)
    run_id, out = _in_place_run(
        cli,
        lab,
        tmp_path,
        strategy,
        lambda _: lab.kill_host("node-b"),
        ", rejoin_wait: 1",
        "min_hosts: 1\n",
    )
    lost, server = (2, {1: "succeeded"}) if strategy == "asgd" else (1, {})
    said = f"and no host can take rank {lost}: the others go on without them after restart"
    assert "node-b lost (" in out and said in out, out
    assert not server or f"worker rank {lost} is gone: the servers go on without it" in out, out
    state = cli.state(run_id)
    assert (state["restarts"], state["respawns"], state["hosts"]) == (0, 1, ["node-a"]), state
    statuses = {r["rank"]: r["status"] for r in state["ranks"]}
    assert statuses == {0: "succeeded", lost: "dropped", **server}, statuses
    assert state["phase"] == "succeeded"
    status = cli.run("status", run_id).stdout
    assert "attempt 1 failed" not in status, status  # the others went on: no attempt ended
    assert f"rank {lost} left out, the others went on" in status, status
    accuracy = _final(cli, run_id)["test_acc"]
    assert accuracy >= UNINTERRUPTED[strategy] - 0.015, accuracy
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)
