"""A Slurm cluster without a Slurm: its spec (file, line and key of every refusal), the
``sbatch`` command and holding script, the ``srun`` line of a step, the environment
Slurm's commands get, and the plan's record of the allocation (round trip)."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from dmlctl.errors import SpecError
from dmlctl.plan.model import LaunchPlan
from dmlctl.slurm.allocation import (
    Allocation,
    WaitStopped,
    ended,
    hold_script,
    request_argv,
    request_lines,
    wait_running,
)
from dmlctl.slurm.commands import SlurmRefused, failure, slurm_env
from dmlctl.slurm.transport import Node
from dmlctl.spec.loader import load_cluster
from dmlctl.spec.models import ClusterSpec
from dmlctl.spec.slurm import SlurmSpec
from tests.unit.test_spec import issues_of, write

SLURM_CASES = [
    ("scheduler: slurm\nslurm:\n  nodes: 0\n", 3, "slurm.nodes", "nodes must be from 1 to"),
    ("scheduler: slurm\nslurm:\n  nodes: 4-2\n", 3, "slurm.nodes", "a range's low end first"),
    ("scheduler: slurm\nslurm:\n  nodes: many\n", 3, "slurm.nodes", "or a range ('2-4')"),
    ("scheduler: slurm\nslurm:\n  time: soon\n", 3, "slurm.time", "'soon' is no Slurm time"),
    (
        "scheduler: slurm\nslurm:\n  sbatch_options: ['--time=5']\n",
        3,
        "slurm.sbatch_options[0]",
        "--time is set by dmlctl",
    ),
    (
        "scheduler: slurm\nslurm:\n  sbatch_options: ['-N3']\n",
        3,
        "slurm.sbatch_options[0]",
        "-N is set by dmlctl",
    ),
    (
        "scheduler: slurm\nslurm:\n  sbatch_options: ['constraint=a100']\n",
        3,
        "slurm.sbatch_options[0]",
        "is not one sbatch option",
    ),
    (
        "scheduler: slurm\nslurm:\n  sbatch_options: ['--part=gpu']\n",
        3,
        "slurm.sbatch_options[0]",
        "--partition is set by dmlctl",
    ),
    (
        "scheduler: slurm\nslurm:\n  sbatch_options: ['--wait']\n",
        3,
        "slurm.sbatch_options[0]",
        "--wait is refused: sbatch would not return",
    ),
    (
        "scheduler: slurm\nslurm:\n  sbatch_options: ['--gres=gpu:4']\n",
        3,
        "slurm.sbatch_options[0]",
        "use gpus_per_node",
    ),
    ("scheduler: slurm\nslurm:\n  mem: lots\n", 3, "slurm.mem", "'lots' is no Slurm memory size"),
    ("scheduler: slurm\nslurm:\n  partiton: x\n", 3, "slurm.partiton", "did you mean"),
    ("scheduler: slurm\nhosts:\n  - address: a\n", 2, "hosts", "remove 'hosts'"),
    ("scheduler: pbs\nhosts:\n  - address: a\n", 1, "scheduler", "'ssh' or 'slurm'"),
    ("slurm:\n  nodes: 2\nhosts:\n  - address: a\n", 1, "slurm", "needs 'scheduler: slurm'"),
]


@pytest.mark.parametrize(("text", "line", "path", "fragment"), SLURM_CASES)
def test_a_bad_slurm_cluster_names_file_line_and_key(
    tmp_path: Path, text: str, line: int, path: str, fragment: str
) -> None:
    file = write(tmp_path, text, "cluster.yaml")
    issues = issues_of(load_cluster, file)
    assert [(i.file, i.line, i.path) for i in issues] == [(file, line, path)], issues
    assert fragment in issues[0].message


def test_a_slurm_cluster_has_one_placeholder_host_per_node(tmp_path: Path) -> None:
    text = "scheduler: slurm\nslurm:\n  nodes: 3\n  sbatch_options: ['--constraint=a b']\n"
    cluster = load_cluster(write(tmp_path, text, "cluster.yaml"))
    assert [(h.name, h.address, h.is_local) for h in cluster.resolved_hosts()] == [
        (f"node-{i}", f"node-{i}", False) for i in range(3)
    ]
    assert ClusterSpec.model_validate(cluster.model_dump()) == cluster  # validates again
    assert cluster.slurm_spec is not None and cluster.slurm_spec.nodes == 3
    plain = load_cluster(write(tmp_path, "hosts:\n  - address: a\n", "ssh.yaml"))
    assert plain.slurm_spec is None


def test_sbatch_asks_for_the_block_and_the_script_only_holds_the_nodes() -> None:
    spec = SlurmSpec(
        nodes=2,
        partition="gpu",
        account="ml",
        qos="high",
        time="1-00:00:00",
        gpus_per_node=4,
        exclusive=True,
        sbatch_options=["--constraint=a b"],
        mem="64G",
    )
    assert request_argv(spec, "lm", slots=4) == [
        "sbatch",
        "--parsable",
        "--job-name=dmlctl-lm",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--output=/dev/null",
        "--cpus-per-task=4",
        "--no-kill",
        "--no-requeue",
        "--partition=gpu",
        "--account=ml",
        "--qos=high",
        "--time=1-00:00:00",
        "--mem=64G",
        "--gpus-per-node=4",
        "--exclusive",
        "--constraint=a b",
    ]
    lines = request_lines(spec, "lm", None)
    assert lines[0].endswith("'--constraint=a b' <<script")
    where = Allocation("17", {"node-0": "gpu-3", "node-1": "gpu-9"})
    assert request_lines(spec, "lm", where) == ["in Slurm job 17: node-0 = gpu-3, node-1 = gpu-9"]


def test_the_holding_script_exits_on_sigterm_and_takes_its_sleep_with_it(tmp_path: Path) -> None:
    script = tmp_path / "hold.sh"
    script.write_text(hold_script("t"))
    proc = subprocess.Popen(["sh", str(script)], start_new_session=True)
    try:
        children = tmp_path / "children"
        for _ in range(100):  # its first sleep has started
            out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
            if out.stdout.strip():
                children.write_text(out.stdout)
                break
            subprocess.run(["sleep", "0.02"])
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        proc.kill()
    sleeps = children.read_text().split()
    for _ in range(100):  # killed by the script, it dies once it is scheduled
        if not any(_running(pid) for pid in sleeps):
            break
        subprocess.run(["sleep", "0.02"])
    assert sleeps and not any(_running(pid) for pid in sleeps)


def test_the_holding_script_ends_once_no_agent_step_has_run_for_a_while(tmp_path: Path) -> None:
    """A controller killed -9 leaves no agent (each sees its stdin close); the script
    then ends the allocation by itself: soon after the last agent, later when none
    ever ran, never on checks Slurm did not answer."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"

    def hold(answer: str, timeout: float = 30) -> int:
        calls.write_text("")
        squeue.write_text(f"#!/bin/sh\necho x >> {calls}\n{answer}\n")
        squeue.chmod(0o755)
        script = tmp_path / "hold.sh"
        script.write_text(hold_script("t", check_s=0.05, idle_checks=4, first_checks=6))
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "7"}
        assert subprocess.run(["sh", str(script)], env=env, timeout=timeout).returncode == 0
        return len(calls.read_text().split())

    agents_then_none = f'[ "$(wc -l < {calls})" -le 3 ] && echo dmlctl-agent-node-0-1; echo batch'
    assert hold(agents_then_none) == 3 + 4
    assert hold("echo batch") == 6  # no agent ever: the longer allowance
    with pytest.raises(subprocess.TimeoutExpired):
        hold("exit 1", timeout=1)  # Slurm does not answer: it holds on


def _running(pid: str) -> bool:
    """Whether process ``pid`` exists and is no zombie (one not reaped yet is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_step_runs_setup_then_the_command_in_its_directory() -> None:
    node = Node("17", "gpu-3", conf="/etc/lab.conf", gpus=2, setup="module load cuda")
    argv = node.command(["python", "-c", "print('a b')"], "~/work dir", "dmlctl-node-0")
    assert argv[:10] == [
        "srun",
        "--jobid=17",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=gpu-3",
        "--overlap",
        "--quiet",
        "--job-name=dmlctl-node-0",
        "--gpus-per-node=2",
        "sh",
    ]
    assert argv[10:] == [
        "-c",
        "{ module load cuda\n} >&2 || exit 97\n"
        "cd \"$HOME\"'/work dir' && exec python -c 'print('\"'\"'a b'\"'\"')'",
    ]

    def run(setup: str, home: str) -> subprocess.CompletedProcess[str]:
        script = argv[11].replace("module load cuda", setup)
        return subprocess.run(
            ["sh", "-c", script], text=True, capture_output=True, env={"HOME": home}
        )

    said = run("echo loaded", "/nonexistent")
    assert said.stdout == "" and "loaded" in said.stderr  # stdout is the command's alone
    assert "/work dir" in said.stderr and said.returncode != 0  # tried before the command
    failed = run("echo no such module >&2; false", "/")
    assert failed.returncode == 97 and "no such module" in failed.stderr


def test_slurm_commands_get_the_clusters_conf_and_not_an_enclosing_allocation() -> None:
    env = slurm_env("/lab/slurm.conf", {"PATH": "/bin", "SLURM_JOB_ID": "9", "SRUN_X": "1"})
    assert env == {"PATH": "/bin", "SLURM_CONF": "/lab/slurm.conf"}
    kept = slurm_env(None, {"SLURM_CONF": "/etc/other.conf", "SALLOC_PARTITION": "p"})
    assert kept == {"SLURM_CONF": "/etc/other.conf"}


def test_slurm_calling_a_request_invalid_is_the_users_input() -> None:
    refused = failure(["sbatch"], "sbatch: error: invalid partition specified: gpu\n", 1)
    assert isinstance(refused, SlurmRefused) and refused.exit_code == 2
    assert str(refused) == "sbatch failed: sbatch: error: invalid partition specified: gpu"
    down = failure(["squeue"], "squeue: error: Unable to contact slurm controller\n", 1)
    assert not isinstance(down, SlurmRefused) and down.exit_code == 1


def test_the_plan_keeps_its_allocation(tmp_path: Path) -> None:
    from dmlctl.launch.api import plan_run
    from dmlctl.runs.store import RunStore
    from dmlctl.spec.models import JobSpec

    (tmp_path / "train.py").write_text("")
    job = JobSpec.model_validate({"script": "train.py", "workdir": str(tmp_path), "workers": 2})
    cluster = ClusterSpec.model_validate({"scheduler": "slurm", "slurm": {"nodes": 2}})
    plan = plan_run(job, cluster, RunStore(tmp_path / "home"), port=29500)
    where = Allocation("5", {"node-0": "lab-0", "node-1": "lab-1"}, "/c", 1, "true")
    plan = dataclasses.replace(plan, allocation=where)
    assert LaunchPlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(SpecError):
        load_cluster(write(tmp_path, "scheduler: slurm\nslurm: 3\n", "c.yaml"))


@pytest.mark.parametrize(
    ("answers", "said"),
    [
        (["TIMEOUT"], ("TIMEOUT", "reached its time limit (slurm.time)")),
        (["COMPLETING", "COMPLETING", "PREEMPTED"], ("PREEMPTED", "was preempted")),
        (["NODE_FAIL"], ("NODE_FAIL", "lost a node (NODE_FAIL)")),
        (["RUNNING"], None),
        ([""], ("GONE", "is no longer known to Slurm")),
    ],
)
def test_how_an_allocation_ended_is_said_once_it_has_settled(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    answers: list[str],
    said: tuple[str, str] | None,
) -> None:
    """squeue's answers in turn (the last one repeated); an ending job (COMPLETING) is
    waited for: only its end says why."""
    calls = tmp_path / "calls"
    calls.write_text("")
    script = "\n".join(
        f'[ "$(wc -l < {calls})" -eq {i} ] && {{ echo x >> {calls}; echo "{a}|None||"; exit 0; }}'
        for i, a in enumerate(answers)
    )
    squeue = tmp_path / "squeue"
    squeue.write_text(
        f'#!/bin/sh\n{script}\necho "{answers[-1]}|None||"\n'.replace('echo "|None||"', "true")
    )
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    got = ended(Allocation("7", {}), settle_s=10)
    if said is None:
        assert got is None
    else:
        assert got == (said[0], f"Slurm job 7 {said[1]}: every rank in it was stopped by Slurm")


def test_a_stop_ends_the_wait_for_a_queued_allocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeued run's new allocation may queue for hours: a stop of the run (Ctrl-C,
    dmlctl stop) ends the wait within a poll, without waiting for Slurm."""
    squeue = tmp_path / "squeue"
    squeue.write_text('#!/bin/sh\necho "PENDING|Priority||"\n')
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    seen: list[str] = []
    with pytest.raises(WaitStopped, match="the wait for Slurm job 7 was stopped"):
        wait_running("7", None, lambda now: seen.append(now.reason), 0.01, lambda: len(seen) >= 3)
    assert seen == ["Priority"] * 3
