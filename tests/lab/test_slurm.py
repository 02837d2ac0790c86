"""A real Slurm (``dmlctl lab up --slurm``: munge, slurmctld, a slurmd per lab
namespace) and dmlctl on it: the quick start and the doctor on 2 nodes, a node range
run on the nodes Slurm grants, parameter servers on a node
of their own, ``stop`` (no job left in Slurm, no process on any node), a rank killed
(restarted in the same allocation), bad scheduler options (exit 2, nothing asked of
Slurm), the dry run's ``sbatch`` and ``srun`` lines, and a node that stops answering
(the run goes on on the node left)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.integration.procs import wait_until
from tests.lab.conftest import LabCli, lab_cli
from tests.ssh.lab import SILENCE_S

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
INTEGRATION_JOBS = REPO / "tests" / "integration" / "jobs"
SLURM_TOOLS = ("slurmctld", "slurmd", "sbatch", "munged")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCli]:
    """A 3-host lab with Slurm over it, shared by this module's tests."""
    missing = [t for t in SLURM_TOOLS if shutil.which(t) is None]
    if missing and os.environ.get("CI") != "true":
        pytest.skip(f"Slurm is not installed here ({', '.join(missing)})")
    cli = lab_cli(tmp_path_factory.mktemp("slurm"))
    proc = cli.run("lab", "up", "--hosts", "3", "--slurm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        yield cli
    finally:
        cli.run("lab", "down")


def cluster(lab: LabCli, where: Path, **slurm: object) -> Path:
    """The lab's Slurm cluster file with ``slurm`` keys changed, written to ``where``."""
    doc = yaml.safe_load((lab.lab_dir / "slurm.yaml").read_text())
    doc["slurm"].update(slurm)
    path = where / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def squeue(lab: LabCli, *args: str) -> str:
    """``squeue`` on the lab's Slurm (its jobs, one a line: id, state)."""
    conf = str(lab.lab_dir / "slurm" / "slurm.conf")
    proc = subprocess.run(
        ["squeue", "-h", "-o", "%i %T", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": conf},
        check=True,
    )
    return proc.stdout


def node_processes(n: int) -> list[str]:
    """The command lines of what runs in the lab's first ``n`` namespaces besides the
    lab's own daemons (sshd, slurmd)."""
    found = []
    for i in range(n):
        netns = ["ip", "netns", "pids", f"dmlctl-lab-{i}"]
        for pid in subprocess.run(netns, capture_output=True, text=True).stdout.split():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            cmd = b" ".join(argv).decode(errors="replace").strip()
            if cmd and not any(daemon in cmd for daemon in ("sshd", "slurmd")):
                found.append(f"{pid}: {cmd}")
    return found


def test_the_quick_start_runs_on_two_slurm_nodes(slurm: LabCli, tmp_path: Path) -> None:
    path = cluster(slurm, tmp_path, nodes=2)
    quick = REPO / "examples" / "quickstart"
    proc = slurm.run("launch", str(quick / "job.yaml"), "--cluster", str(path), "--ui", "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "final accuracy" in proc.stdout
    assert "2 nodes (lab-0, lab-1)" in proc.stderr, proc.stderr
    run_id = slurm.runs()[0].name
    status = slurm.run("status", run_id)
    lines = status.stdout.splitlines()
    where = next(line for line in lines if line.startswith("where: Slurm job "))
    assert where.endswith(", completed"), status.stdout
    assert "  node-0: lab-0" in lines and "  node-1: lab-1" in lines
    assert squeue(slurm, "-t", "PENDING,RUNNING") == ""
    job_id = where.split()[3].rstrip(",")
    fetch = slurm.run("logs", run_id, "--fetch")  # the nodes' files went with the job
    assert f"its Slurm job {job_id} has ended (COMPLETED)" in fetch.stdout + fetch.stderr
    doctor = slurm.run("doctor", "--cluster", str(path))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "Slurm partition lab: up, 3 nodes (" in doctor.stderr, doctor.stderr
    assert "all 2 hosts ready" in doctor.stdout, doctor.stdout
    doctor_job = doctor.stderr.split("Slurm job ")[1].split(":")[0]
    state = squeue(slurm, "-t", "all", "-j", doctor_job).split()
    assert state[1] in ("COMPLETED", "COMPLETING"), state  # the doctor ends its allocation


def test_a_node_range_runs_on_the_nodes_slurm_grants(slurm: LabCli, tmp_path: Path) -> None:
    path = cluster(slurm, tmp_path, nodes="1-3")
    conf = str(slurm.lab_dir / "slurm" / "slurm.conf")
    env = {**os.environ, "SLURM_CONF": conf}
    hold = ["sbatch", "--parsable", "-N1", "--exclusive", "-p", "lab", "-o", "/dev/null"]
    hold.append("--wrap=sleep 300")
    blocker = subprocess.run(hold, capture_output=True, text=True, env=env, check=True)
    blocker_id = blocker.stdout.strip()
    try:
        assert wait_until(lambda: f"{blocker_id} RUNNING" in squeue(slurm), 20), "no blocker"
        quick = REPO / "examples" / "quickstart" / "job.yaml"
        proc = slurm.run("launch", str(quick), "--cluster", str(path), "--ui", "plain")
    finally:
        subprocess.run(["scancel", blocker_id], env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Slurm job" in proc.stderr and ": 2 nodes (" in proc.stderr, proc.stderr
    run_id = re.search(r"run (\S+) succeeded", proc.stdout)
    assert run_id is not None, proc.stdout
    plan = (slurm.home / "runs" / run_id[1] / "plan.json").read_text()
    assert '"node-2"' not in plan and '"min_hosts": 1' in plan  # as many as were free
    bad = cluster(slurm, tmp_path, partition="gpu-nowhere")
    doctor = slurm.run("doctor", "--cluster", str(bad))
    assert doctor.returncode == 2, doctor.stdout + doctor.stderr
    said = f"dmlctl: {bad}:[0-9]+ slurm.partition: sinfo: Slurm has no partition 'gpu-nowhere'"
    assert re.fullmatch(said, doctor.stderr.strip()), doctor.stderr


def test_a_launch_inside_an_allocation_runs_on_its_nodes_and_leaves_it(
    slurm: LabCli, tmp_path: Path
) -> None:
    """``salloc -N2 dmlctl launch …`` (as a batch script would): the run takes the
    enclosing allocation's nodes, asks for none of its own, and leaves that allocation
    to salloc, which ends it when the launch returns; nothing is left on the nodes."""
    path = cluster(slurm, tmp_path, nodes=2)
    quick = REPO / "examples" / "quickstart" / "job.yaml"
    conf = str(slurm.lab_dir / "slurm" / "slurm.conf")
    env = {**slurm.env, "SLURM_CONF": conf}
    before = squeue(slurm, "-t", "all")
    launch = [sys.executable, "-m", "dmlctl", "launch", str(quick), "--cluster", str(path)]
    argv = ["salloc", "-N2", "-p", "lab", "--job-name=mine", *launch, "--ui", "plain"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "final accuracy" in proc.stdout
    assert re.search(r"Slurm job (\d+) \(dmlctl runs inside it\): 2 nodes", proc.stderr), (
        proc.stderr
    )
    known = {line.split()[0] for line in before.splitlines()}

    def new_jobs() -> list[str]:
        return [ln for ln in squeue(slurm, "-t", "all").splitlines() if ln.split()[0] not in known]

    # salloc's own job, ended by salloc (COMPLETING for a moment on a loaded machine)
    assert wait_until(lambda: [j.split()[-1] for j in new_jobs()] == ["COMPLETED"], 30), new_jobs()
    assert wait_until(lambda: node_processes(3) == [], 30), node_processes(3)


def test_parameter_servers_run_on_a_node_of_their_own(slurm: LabCli, tmp_path: Path) -> None:
    job = tmp_path / "asgd.yaml"
    source = yaml.safe_load((REPO / "examples" / "parameter-server" / "asgd.yaml").read_text())
    source.update(
        workdir=str(REPO / "examples" / "parameter-server"),
        server_hosts=["node-2"],
        args=["--epochs", "1"],
    )
    job.write_text(yaml.safe_dump(source))
    path = cluster(slurm, tmp_path, nodes=3)
    proc = slurm.run("launch", str(job), "--cluster", str(path), "--ui", "plain", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = slurm.state(slurm.runs()[0].name)
    placed = {(r["host"], r["role"]) for r in state["ranks"]}
    assert placed == {("node-0", "worker"), ("node-1", "worker"), ("node-2", "server")}


@pytest.mark.parametrize("salloc", [False, True])
def test_stop_cancels_the_allocation_and_leaves_no_process(
    slurm: LabCli, tmp_path: Path, salloc: bool
) -> None:
    """A detached run is stopped: its job cancelled, nothing left on the nodes. With
    ``salloc``, the allocation is held by salloc on this machine, which outlives the
    launch that started it and goes with the stop. Before it, status says how long the
    job has left, from its end time."""
    path = cluster(slurm, tmp_path, nodes=2, salloc=salloc, time="10")
    forever = INTEGRATION_JOBS / "forever" / "job.yaml"
    runs = set(slurm.runs())
    started = slurm.run("launch", str(forever), "--cluster", str(path), "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    (run,) = set(slurm.runs()) - runs
    run_id = run.name
    running = lambda: all(r["status"] == "running" for r in slurm.state(run_id)["ranks"])  # noqa: E731
    assert wait_until(running, 90), slurm.state(run_id)
    job_id = squeue(slurm, "-t", "RUNNING").split()[0]
    status = slurm.run("status", run_id).stdout
    left = re.compile(rf"where: Slurm job {job_id}, running, 0:(09|10):\d\d left \(ends 20\d\d-")
    assert any(left.match(line) for line in status.splitlines()), status
    stopped = slurm.run("stop", run_id)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    # The run's end may have ended the job before stop looks (salloc's always).
    assert re.search(rf"; Slurm job {job_id} (cancelled|has ended)$", stopped.stdout.strip())
    assert wait_until(lambda: squeue(slurm, "-t", "PENDING,RUNNING") == "", 30)
    assert wait_until(lambda: node_processes(3) == [], 30), node_processes(3)
    held = ["pgrep", "-f", "bin/salloc .*--job-name=dmlctl-forever"]
    assert wait_until(lambda: subprocess.run(held, capture_output=True).returncode == 1, 10)


def test_a_killed_rank_restarts_in_the_same_allocation(slurm: LabCli, tmp_path: Path) -> None:
    path = cluster(slurm, tmp_path, nodes=2)
    before = squeue(slurm, "-t", "all")
    proc = slurm.run("launch", str(JOBS / "killed" / "job.yaml"), "--cluster", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "rank 0 finished on attempt 2 on lab-0" in out, out
    assert "rank 1 finished on attempt 2 on lab-1" in out, out
    known = {line.split()[0] for line in before.splitlines()}  # a job may have ended since
    new = [line for line in squeue(slurm, "-t", "all").splitlines() if line.split()[0] not in known]
    assert len(new) == 1 and new[0].endswith(" COMPLETED"), new  # one allocation, both attempts


def test_a_job_cancelled_outside_dmlctl_is_the_runs_root_cause(
    slurm: LabCli, tmp_path: Path
) -> None:
    """scancel of the run's job (as a time limit or a preemption ends it): every rank
    dies, the run fails at once with the job's end as its root cause, no restart."""
    path = cluster(slurm, tmp_path, nodes=2)
    forever = INTEGRATION_JOBS / "forever" / "job.yaml"
    runs = set(slurm.runs())
    proc = slurm.popen("launch", str(forever), "--cluster", str(path), "--ui", "plain")
    try:
        assert wait_until(lambda: len(set(slurm.runs()) - runs) == 1, 60), proc.poll()
        (run,) = set(slurm.runs()) - runs
        running = lambda: all(r["status"] == "running" for r in slurm.state(run.name)["ranks"])  # noqa: E731
        assert wait_until(running, 90), slurm.state(run.name)
        job_id = squeue(slurm, "-t", "RUNNING").split()[0]
        conf = str(slurm.lab_dir / "slurm" / "slurm.conf")
        env = {**os.environ, "SLURM_CONF": conf}
        subprocess.run(["scancel", job_id], env=env, check=True)
        out, _ = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 1, out
    state = slurm.state(run.name)
    cause = state["root_cause"]
    assert cause["exc_type"] == "AllocationEnded", cause
    assert cause["message"] == (
        f"Slurm job {job_id} was cancelled outside dmlctl (scancel): every rank in it "
        "was stopped by Slurm"
    )
    assert state["restarts"] == 0
    assert wait_until(lambda: node_processes(3) == [], 30), node_processes(3)


def elastic_job(tmp_path: Path, extra: str = "", workers: int = 2, env: str = "") -> Path:
    """40 steps with a checkpoint every 5 (tests/ssh/jobs/elastic): rank 0 writes the
    final loss to ``out.txt``; ``env``: more lines of its env block."""
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: elastic\nscript: train.py\nworkdir: {REPO / 'tests' / 'ssh' / 'jobs' / 'elastic'}\n"
        f"workers: {workers}\nenv:\n  OUT: {tmp_path / 'out.txt'}\n{env}"
        "checkpoint:\n  every_steps: 5\n"
        "restart:\n  max_infra_restarts: 2\n  backoff_initial: 0.2\n  host_wait: 3\n"
        "  stop_grace: 1\n" + extra
    )
    return job


WARNED = "reaches its time limit in"


@pytest.mark.parametrize("end", ["was preempted", "reached its time limit (slurm.time)", WARNED])
def test_an_early_end_is_requeued_and_resumed_from_its_checkpoint(
    slurm: LabCli, tmp_path: Path, end: str
) -> None:
    """With slurm.requeue, a job of the lab's urgent partition preempting the run's
    (Slurm cancels it; the job's directory on the nodes is removed first, so that the
    new nodes must be given it again), the run's job reaching its time limit (its end time moved to
    now), or dmlctl's own warning before it (``warn_before_end``, the end time moved to
    33 s from now) is answered with a new allocation, and the run goes on from the
    checkpoint the controller kept; status then speaks of the new job."""
    warned = {"time": "10", "warn_before_end": 30} if end == WARNED else {}
    path = cluster(slurm, tmp_path, nodes=2, requeue=True, **warned)
    runs = set(slurm.runs())
    # Slurm looks at time limits every few seconds, up to half a minute: the first
    # attempt takes a second a step after its first checkpoint (35 s), so that the
    # limit is seen within it.
    slow = "" if end == "was preempted" else "  STEP_S_ATTEMPT_1: '1'\n"
    job = elastic_job(tmp_path, env=slow)
    proc = slurm.popen("launch", str(job), "--cluster", str(path), "--ui", "plain")
    conf = str(slurm.lab_dir / "slurm" / "slurm.conf")
    env = {**os.environ, "SLURM_CONF": conf}
    try:
        assert wait_until(lambda: len(set(slurm.runs()) - runs) == 1, 60), proc.poll()
        (run,) = set(slurm.runs()) - runs
        assert wait_until((run / "checkpoints" / "LATEST").is_file, 90), "no checkpoint copy"
        first = squeue(slurm, "-t", "RUNNING").split()[0]
        if end == "was preempted":  # the new nodes get the job again: as if node-local
            shutil.rmtree(Path(yaml.safe_load(path.read_text())["defaults"]["workdir"]) / "elastic")
            ask = ["sbatch", "-p", "urgent", "-N3", "--exclusive", "--output=/dev/null"]
            ask.append("--wrap=sleep 3")
        else:  # a real TIMEOUT, seen by Slurm's next check; or warned of it 30 s before
            ahead = 33 if end == WARNED else 1
            then = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + ahead))
            ask = ["scontrol", "update", f"JobId={first}", f"EndTime={then}"]
        subprocess.run(ask, env=env, check=True, capture_output=True)
        out, _ = proc.communicate(timeout=150)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    state = slurm.state(run.name)
    cause = state["failures"][0]
    assert cause["exc_type"] == "AllocationRequeued", state["failures"]
    assert cause["message"].startswith(f"Slurm job {first} {end}"), cause
    if end == WARNED:  # the ranks stopped before the limit, and dmlctl cancelled the job
        assert squeue(slurm, "-t", "all", "-j", first).split()[1] == "CANCELLED"
    assert state["restarts"] == 1, state["failures"]
    starts = [line for line in out.splitlines() if "attempt 2 starts at step" in line]
    assert starts and int(starts[0].rsplit(" ", 1)[1]) >= 5, out
    assert (tmp_path / "out.txt").read_text().startswith("40 ")
    where = next(
        ln for ln in slurm.run("status", run.name).stdout.splitlines() if ln.startswith("where: ")
    )
    assert f"Slurm job {first}," not in where and where.endswith(", completed"), where
    assert wait_until(lambda: squeue(slurm, "-t", "PENDING,RUNNING") == "", 30)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sbatch_options": ["--nodes=5"]}, "slurm.sbatch_options[0]: --nodes is set by dmlctl"),
        ({"time": "soon"}, "slurm.time: 'soon' is no Slurm time"),
        ({"partition": "gpu-nowhere"}, "slurm.partition: sbatch failed: "),
    ],
)
def test_bad_scheduler_options_exit_2_and_leave_nothing(
    slurm: LabCli, tmp_path: Path, change: dict[str, object], message: str
) -> None:
    path = cluster(slurm, tmp_path, **change)
    before, runs = squeue(slurm, "-t", "all"), slurm.runs()
    plain = INTEGRATION_JOBS / "plain" / "job.yaml"
    proc = slurm.run("launch", str(plain), "--cluster", str(path))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and message in lines[-1], proc.stderr
    assert squeue(slurm, "-t", "all") == before
    assert slurm.runs() == runs


def test_the_dry_run_prints_the_batch_script_and_the_srun_lines(
    slurm: LabCli, tmp_path: Path
) -> None:
    path = cluster(slurm, tmp_path, nodes=2, time="10", sbatch_options=["--comment=dry"])
    before = squeue(slurm, "-t", "all")
    plain = INTEGRATION_JOBS / "plain" / "job.yaml"
    proc = slurm.run("launch", str(plain), "--cluster", str(path), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert (
        "ask Slurm for the allocation: sbatch --parsable --job-name=dmlctl-plain --nodes=2 "
        "--ntasks-per-node=1 --output=/dev/null --cpus-per-task=1 --no-kill --no-requeue "
        "--partition=lab "
        "--time=10 --comment=dry <<script"
    ) in out, out
    assert "trap 'stop=1; kill -9 \"$nap\" 2>/dev/null' TERM INT" in out
    assert (
        "host node-1 — node-1 through srun --jobid=<job> --nodes=1 --ntasks=1 "
        "--nodelist=<node 1> --overlap --quiet --job-name=dmlctl-agent-node-1"
    ) in out, out
    assert squeue(slurm, "-t", "all") == before


# Last of the tests that share the lab: lab-2 is busy for a minute and more after its
# slurmd is started again (its job's end is settled late), and no test after needs it.
def launch_and_kill(
    slurm: LabCli, job: Path, cluster_path: Path, node: str, ready: Callable[[Path], bool]
) -> tuple[Path, str]:
    """Launch ``job`` on ``cluster_path``; once ``ready(run directory)``, kill every
    process of the run's ``node`` (:func:`kill_node`); its slurmd starts again once
    the run ended, which must succeed. The run's directory and the launch's output."""
    runs = set(slurm.runs())
    proc = slurm.popen("launch", str(job), "--cluster", str(cluster_path), "--ui", "plain")
    lab = ""
    try:
        assert wait_until(lambda: len(set(slurm.runs()) - runs) == 1, 60), proc.poll()
        (run,) = set(slurm.runs()) - runs
        assert wait_until(lambda: ready(run), 120), slurm.state(run.name)
        lab = kill_node(run, node)
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
        if lab:
            start_slurmd(slurm, lab)
    assert proc.returncode == 0, out
    return run, out


def kill_node(run: Path, node: str) -> str:
    """SIGKILL every process on the lab machine that is ``node`` of ``run``'s
    allocation (slurmd too: a node that dies); that machine's lab name."""
    lab = str(json.loads((run / "plan.json").read_text())["allocation"]["nodes"][node])
    netns = ["ip", "netns", "pids", f"dmlctl-{lab}"]
    for pid in subprocess.run(netns, capture_output=True, text=True).stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    return lab


def start_slurmd(slurm: LabCli, lab: str) -> None:
    """Start the slurmd of lab machine ``lab`` again (after :func:`kill_node`)."""
    conf = slurm.lab_dir / "slurm" / "slurm.conf"
    slurmd = ["nsenter", f"--net=/var/run/netns/dmlctl-{lab}", "slurmd", "-N", lab]
    subprocess.run([*slurmd, "-f", str(conf)], check=False)


def test_the_first_node_dying_is_lost_and_a_range_goes_on_on_the_nodes_left(
    slurm: LabCli, tmp_path: Path
) -> None:
    """Every process on node-0's machine is SIGKILLed, slurmd too (a node that dies,
    and the one that held rank 0 and the rendezvous): with ``nodes: 1-3`` the run goes
    on on node-1 and node-2, in the same allocation, meeting on node-1 now, from the
    checkpoint the controller kept. The node's slurmd is started again after."""
    path = cluster(slurm, tmp_path, nodes="1-3")
    job = elastic_job(tmp_path, f"  host_timeout: {SILENCE_S}\n", workers=3)
    checkpointed = lambda run: (run / "checkpoints" / "LATEST").is_file()  # noqa: E731
    run, _ = launch_and_kill(slurm, job, path, "node-0", checkpointed)
    state = slurm.state(run.name)
    lost = state["failures"][0]
    assert (lost["host"], lost["exc_type"]) == ("node-0", "AgentLost"), lost
    assert f"no message from the host for {SILENCE_S} s" in lost["message"], lost
    assert state["hosts"] == ["node-1", "node-2"] and state["restarts"] == 1
    assert (tmp_path / "out.txt").read_text().startswith("40 ")


def test_in_place_a_dead_nodes_rank_goes_to_a_spare_node_of_the_allocation(
    slurm: LabCli, tmp_path: Path
) -> None:
    """restart.mode: in_place under local-sgd, 2 workers on a 3-node allocation (one
    node spare): every process on node-0's machine — rank 0's, where torchrun would
    serve the run's store; here the controller holds it — is SIGKILLed, slurmd too;
    after its silence, rank 0 starts on node-2 in the same allocation and joins rank 1,
    which never restarts. Steps paced to 10 ms: the kill lands mid-training (unpaced,
    the 400 steps after step 100 take half a second, and the run once ended first)."""
    path = cluster(slurm, tmp_path, nodes=3)
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: slurmswap\nworkdir: {REPO / 'examples' / 'parameter-server'}\n"
        "script: train.py\nargs: ['--epochs', '2', '--step-sleep', '0.01']\n"
        "workers: 2\nstrategy: local-sgd\n"
        f"restart: {{mode: in_place, host_timeout: {SILENCE_S}}}\nmax_hosts: 2\n"
    )
    trained = lambda run: any((r["step"] or 0) >= 100 for r in slurm.state(run.name)["ranks"])  # noqa: E731
    run, out = launch_and_kill(slurm, job, path, "node-0", trained)
    assert "node-0 lost (" in out and "rank 0 starts again on node-2" in out, out
    assert "rank 0 rejoined at step" in out, out
    state = slurm.state(run.name)
    assert (state["restarts"], state["respawns"]) == (0, 1), state["failures"]
    assert sorted(state["hosts"]) == ["node-1", "node-2"], state["hosts"]
    where = {r["rank"]: (r["host"], r["status"], r["step"]) for r in state["ranks"]}
    assert where == {0: ("node-2", "succeeded", 500), 1: ("node-1", "succeeded", 500)}, where


# Last in the file: its node stays down for a while after it is thawed.
def test_a_node_that_stops_answering_is_lost_and_the_run_goes_on(
    slurm: LabCli, tmp_path: Path
) -> None:
    """Everything on lab-1 (slurmd, the agent's step, its ranks) stops answering, as a
    node whose network or kernel hangs: its agent is lost after host_timeout, and with
    ``min_hosts: 1`` the run goes on on node-0 alone, in the same allocation, from the
    checkpoint the controller kept."""
    extra = f"  host_cooldown: 60\n  host_timeout: {SILENCE_S}\nmin_hosts: 1\n"
    job = elastic_job(tmp_path, extra)
    path = cluster(slurm, tmp_path, nodes=2)
    runs = set(slurm.runs())
    proc = slurm.popen("launch", str(job), "--cluster", str(path), "--ui", "plain")
    frozen: list[str] = []
    try:
        assert wait_until(lambda: len(set(slurm.runs()) - runs) == 1, 60), proc.poll()
        (run,) = set(slurm.runs()) - runs
        assert wait_until((run / "checkpoints" / "LATEST").is_file, 90), "no checkpoint copy"
        netns = ["ip", "netns", "pids", "dmlctl-lab-1"]
        frozen = subprocess.run(netns, capture_output=True, text=True).stdout.split()
        for pid in frozen:
            os.kill(int(pid), signal.SIGSTOP)
        out, _ = proc.communicate(timeout=120)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGCONT)
        proc.kill()
    assert proc.returncode == 0, out
    state = slurm.state(run.name)
    lost = state["failures"][0]
    assert (lost["host"], lost["exc_type"]) == ("node-1", "AgentLost"), lost
    assert f"no message from the host for {SILENCE_S} s" in lost["message"], lost
    assert state["hosts"] == ["node-0"] and state["world_size"] == 1
    assert (tmp_path / "out.txt").read_text().startswith("40 ")
    assert wait_until(lambda: squeue(slurm, "-t", "PENDING,RUNNING") == "", 30)
