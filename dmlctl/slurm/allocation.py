"""One Slurm allocation per run: submitted with ``sbatch`` as a batch script that
only holds the nodes (the agents run in it as ``srun --overlap`` steps), waited for,
asked about, and cancelled. Everything through :mod:`dmlctl.slurm.commands`."""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dmlctl.slurm import salloc, steps
from dmlctl.slurm.commands import SlurmError, best_effort, run
from dmlctl.spec.slurm import SlurmSpec

HOLD_SCRIPT = """#!/bin/sh
# dmlctl holds this allocation for job {name}: the host agents run in it as
# `srun --overlap` steps. The run's controller ends it when the run ends (`dmlctl
# stop` cancels it); so does the time limit, and so does this script when no agent
# step has run for {idle_checks} checks {check_s}s apart after one ran, or for
# {first_checks} checks before any did (a controller that died). A check Slurm does
# not answer counts for nothing.
# A TERM is taken in any line, and the nap it cuts short never outlives it (KILL: a
# nap not yet turned into sleep still has this trap).
stop=; nap=
trap 'stop=1; kill -9 "$nap" 2>/dev/null' TERM INT
seen=0; idle=0
while :; do
  sleep {check_s} & nap=$!
  if [ -n "$stop" ]; then kill -9 "$nap" 2>/dev/null; exit 0; fi
  wait "$nap"
  if [ -n "$stop" ]; then exit 0; fi
  steps=$(squeue -h -s -j "$SLURM_JOB_ID" -o %j 2>/dev/null) || continue
  if printf '%s\\n' "$steps" | grep -q '^dmlctl-agent-'; then
    seen=1; idle=0
    continue
  fi
  idle=$((idle + 1))
  if [ "$seen" = 1 ] && [ "$idle" -ge {idle_checks} ]; then exit 0; fi
  if [ "$idle" -ge {first_checks} ]; then exit 0; fi
done
"""
CHECK_S = 60
IDLE_CHECKS = 5
FIRST_CHECKS = 30
"""The holding script looks for agent steps every minute: it ends the allocation
after five minutes without one, or half an hour when none has run yet (preflight,
code sync and the job's setup come first)."""


def hold_script(
    name: str,
    check_s: float = CHECK_S,
    idle_checks: int = IDLE_CHECKS,
    first_checks: int = FIRST_CHECKS,
) -> str:
    """The batch script that holds the allocation of job ``name``."""
    return HOLD_SCRIPT.format(
        name=name, check_s=f"{check_s:g}", idle_checks=idle_checks, first_checks=first_checks
    )


ENDED = (
    "COMPLETING",
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
    "SPECIAL_EXIT",
    "GONE",
)
"""States after which an allocation runs nothing more (``COMPLETING``: it is ending;
``GONE``: Slurm no longer lists it)."""


@dataclass(frozen=True)
class Allocation:
    """A run's Slurm allocation as its plan records it: the job ``job_id`` (Slurm
    configured by ``conf``), the node each host of the plan is (``node-0`` → ``lab-3``),
    the GPUs each step asks for and the shell lines run before each command; the
    ``sbatch`` command that asked for it, whether an early end asks again
    (``requeue``), how many seconds before its time limit the ranks are stopped
    (``warn_s``; 0: never by dmlctl), and whether dmlctl asked for it (``owned``; an
    enclosing allocation dmlctl runs inside is not, and is never ended by it)."""

    job_id: str
    nodes: Mapping[str, str]
    conf: str | None = None
    gpus: int = 0
    setup: str | None = None
    sbatch: tuple[str, ...] = ()
    requeue: bool = False
    warn_s: float = 0.0
    owned: bool = True

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Allocation:
        """Inverse of ``dataclasses.asdict`` (as JSON gave it back); KeyError or
        TypeError when ``data`` is no allocation."""
        return Allocation(
            **{**data, "nodes": dict(data["nodes"]), "sbatch": tuple(data.get("sbatch", ()))}
        )

    def moved(self, job_id: str, nodes: Mapping[str, str]) -> Allocation:
        """The same request, granted again as job ``job_id`` on ``nodes``."""
        return dataclasses.replace(self, job_id=job_id, nodes=dict(nodes))


REQUEUED_STATES = ("TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE")
"""Ends of an allocation that ``slurm.requeue`` answers with a new one (a cancel, a
failure of the holding script or an unknown end are not)."""


@dataclass(frozen=True)
class Granted:
    """An allocation that runs: its job id, its nodes in Slurm's order and each one's
    address."""

    job_id: str
    nodes: list[str]
    addresses: dict[str, str]


def allocate(
    argv: list[str],
    name: str,
    conf: str | None,
    on_wait: Callable[[JobState], None] = lambda _: None,
    on_submit: Callable[[str], None] = lambda _: None,
    stopping: Callable[[], bool] = lambda: False,
    need: int = 1,
) -> Granted:
    """Submit ``argv`` (an :func:`request_argv`) with the holding script of job
    ``name`` and wait until it runs with at least ``need`` nodes (cancelled when the
    wait fails, is interrupted or gets fewer). SlurmError (SlurmRefused for a request
    Slurm calls invalid) when it cannot."""
    if argv[0] == "salloc":
        job_id = salloc.submit(argv, hold_script(name), conf)
    else:
        out = run(argv, conf, input=hold_script(name)).stdout.strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out!r}, not a job id")
    on_submit(job_id)
    try:
        started = wait_running(job_id, conf, on_wait, stopping=stopping)
        nodes = hostnames(started.nodelist, conf)
        if len(nodes) < need:
            raise SlurmError(f"Slurm job {job_id} has {len(nodes)} nodes, not {need}")
        return Granted(job_id, nodes, node_addresses(nodes, conf))
    except BaseException:
        cancel(job_id, conf)
        raise


@dataclass(frozen=True)
class JobState:
    """What ``squeue`` says of an allocation: state, why it waits, its nodes (a Slurm
    node list such as ``lab-[0-1]``), when it ends (``end_time``, local
    ``YYYY-MM-DDTHH:MM:SS``: an end time moved by an administrator too) and its time
    limit as squeue says it (``UNLIMITED``: the end time is only a year ahead);
    ``GONE`` once Slurm forgot it."""

    state: str
    reason: str = ""
    nodelist: str = ""
    end_time: str = ""
    time_limit: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def said(self) -> str:
        """The state in words, with why it waits: ``pending (Priority)``."""
        return self.state.lower() + (f" ({self.reason})" if self.reason else "")


def request_argv(spec: SlurmSpec, name: str, slots: int = 1) -> list[str]:
    """The command that asks for ``spec``'s allocation, each node with ``slots`` worker
    slots: ``sbatch`` (the holding script on its stdin), or with ``slurm.salloc``
    ``salloc`` (the script follows as its command, :func:`dmlctl.slurm.salloc.argv_of`)."""
    cpus = spec.cpus_per_node or slots
    batch = ["--parsable"] if not spec.salloc else []
    argv = [
        "salloc" if spec.salloc else "sbatch",
        *batch,
        f"--job-name=dmlctl-{name}",
        f"--nodes={spec.nodes}",
        *(["--output=/dev/null"] if not spec.salloc else []),
        f"--cpus-per-task={cpus}",
        "--no-kill",  # a failed node ends its steps, not the allocation (min_hosts)
        # Slurm requeuing it under the same id would hide its end (salloc never does);
        # salloc tells the holding script when the allocation ends (a cancel, a limit)
        "--no-requeue" if not spec.salloc else "--kill-command=TERM",
    ]
    if not spec.is_range:  # with it, Slurm gives a range its low end: one task a node
        argv.insert(3 + len(batch), "--ntasks-per-node=1")  # is the default there
    for key, value in (
        ("partition", spec.partition),
        ("account", spec.account),
        ("qos", spec.qos),
        ("time", spec.time),
        ("mem", spec.mem),
    ):
        if value is not None:
            argv.append(f"--{key}={value}")
    if spec.gpus_per_node:
        argv.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.exclusive:
        argv.append("--exclusive")
    return [*argv, *spec.sbatch_options]


def request_lines(
    spec: SlurmSpec, name: str, where: Allocation | None, slots: int = 1
) -> list[str]:
    """What a launch does with Slurm, for the dry run: the ``sbatch`` command and its
    script before the allocation exists, the job and its nodes after."""
    if where is None:
        argv = shlex.join(request_argv(spec, name, slots))
        script = hold_script(name).rstrip("\n").splitlines()
        how = "sh -c <<script (run here, held by salloc)" if spec.salloc else "<<script"
        return [f"ask Slurm for the allocation: {argv} {how}", *(f"    {ln}" for ln in script)]
    nodes = ", ".join(f"{host} = {node}" for host, node in where.nodes.items())
    return [f"in Slurm job {where.job_id}: {nodes}"]


def state(job_id: str, conf: str | None) -> JobState:
    """The allocation's state now (``GONE`` when squeue no longer lists it)."""
    argv = ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%r|%N|%e|%l"]
    proc = run(argv, conf, check=False)
    line = proc.stdout.strip().splitlines()[:1]
    if proc.returncode != 0 or not line:
        if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
            raise SlurmError(f"squeue failed: {proc.stderr.strip() or proc.returncode}")
        return JobState("GONE")
    st, reason, nodes, end, limit = [*line[0].split("|"), "", "", "", ""][:5]
    return JobState(st, "" if reason == "None" else reason, nodes, end, limit)


class WaitStopped(SlurmError):
    """The wait for an allocation was given up (a stop of the run)."""


def wait_running(
    job_id: str,
    conf: str | None,
    on_wait: Callable[[JobState], None] = lambda _: None,
    poll_s: float = 0.5,
    stopping: Callable[[], bool] = lambda: False,
) -> JobState:
    """Wait until the allocation runs (however long it queues: Ctrl-C interrupts the
    wait, ``stopping()`` turning true stops it with :class:`WaitStopped`), asking
    every ``poll_s`` seconds at first and every 10 s after a minute (answering a stop
    within ``poll_s``); its state then. SlurmError when it ends first (cancelled,
    failed, refused), or when Slurm has not answered five times in a row."""
    started, unanswered, asked = time.monotonic(), 0, 0.0
    while True:
        if stopping():
            raise WaitStopped(f"the wait for Slurm job {job_id} was stopped")
        if time.monotonic() - asked < (poll_s if time.monotonic() - started < 60 else 10.0):
            time.sleep(poll_s)
            continue
        asked = time.monotonic()
        try:
            now = state(job_id, conf)
        except SlurmError:
            unanswered += 1
            if unanswered >= 5:
                raise
            continue
        unanswered = 0
        if now.state == "RUNNING":
            return now
        if now.ended:
            why = f" ({now.reason})" if now.reason else ""
            raise SlurmError(f"Slurm job {job_id} ended before it started: {now.state}{why}")
        on_wait(now)


def hostnames(nodelist: str, conf: str | None) -> list[str]:
    """A Slurm node list (``lab-[0-2]``) as node names, in order."""
    proc = run(["scontrol", "show", "hostnames", nodelist], conf)
    return proc.stdout.split()


def node_addresses(nodes: list[str], conf: str | None) -> dict[str, str]:
    """Each node's address (``NodeAddr``; its name where Slurm gives none)."""
    proc = run(["scontrol", "-o", "show", "node", ",".join(nodes)], conf)
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            found[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return {n: found.get(n, n) for n in nodes}


ENDINGS = {
    "TIMEOUT": "reached its time limit (slurm.time)",
    "DEADLINE": "reached its deadline",
    "PREEMPTED": "was preempted",
    "NODE_FAIL": "lost a node (NODE_FAIL)",
    "BOOT_FAIL": "could not boot a node (BOOT_FAIL)",
    "CANCELLED": "was cancelled outside dmlctl (scancel)",
    "OUT_OF_MEMORY": "ran out of memory",
    "GONE": "is no longer known to Slurm",
}


SETTLE_S = 120.0
"""Longest wait for an ending allocation (``COMPLETING``: its steps being killed,
Slurm's ``KillWait``) to say how it ended."""


def ended(
    where: Allocation,
    settle_s: float = SETTLE_S,
    stopping: Callable[[], bool] = lambda: False,
) -> tuple[str, str] | None:
    """How the allocation ended (its state, and why in words), or None while it holds
    its nodes, or when Slurm does not answer (no verdict without an answer). One that
    is ending is waited for (up to ``settle_s``, or until ``stopping()``): only its end
    says why."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            now = state(where.job_id, where.conf)
        except SlurmError:
            return None
        if now.state != "COMPLETING" or time.monotonic() > deadline or stopping():
            break
        time.sleep(0.25)
    if not now.ended:
        return None
    how = ENDINGS.get(now.state, f"ended ({now.state})")
    if not where.owned:  # its time limit is its owner's, not the cluster file's
        how = how.replace(" (slurm.time)", "")
    return now.state, f"Slurm job {where.job_id} {how}: every rank in it was stopped by Slurm"


def require_live(where: Allocation, what: str) -> None:
    """UsageError (one line: ``what``, the job and its state) unless the allocation
    still holds its nodes: its steps can run only while it does."""
    from dmlctl.errors import UsageError

    try:
        now = state(where.job_id, where.conf)
    except SlurmError as e:
        raise UsageError(f"{what}: Slurm does not say how job {where.job_id} is: {e}") from None
    if now.ended:
        said = "gone" if now.state == "GONE" else now.state
        raise UsageError(f"{what}: its Slurm job {where.job_id} has ended ({said})")


def finish(where: Allocation, wait_s: float = 5.0) -> None:
    """End a run's allocation as completed: its holding script is told to exit
    (SIGTERM to the batch step only), which ends every step in it; cancelled when it
    still holds its nodes after ``wait_s`` (a batch node that is gone cannot be told),
    and at once when salloc holds it (no batch step). An allocation dmlctl did not ask
    for (the enclosing one) is left to its owner: only the steps this process started
    in it are cancelled. Never raises."""
    job_id, conf = where.job_id, where.conf
    if not where.owned:
        steps.cancel_steps(job_id, conf, os.getpid())
        return
    if where.sbatch[:1] == ("salloc",):
        cancel(job_id, conf)
        return
    best_effort(["scancel", "--batch", "--signal=TERM", job_id], conf, timeout=wait_s)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if state(job_id, conf).ended:
                return
        except SlurmError:
            break
        time.sleep(0.1)
    cancel(job_id, conf)


def cancel(job_id: str, conf: str | None, name: str | None = None) -> None:
    """Cancel the allocation and everything in it (done already: nothing happens; with
    ``name``, only while the job has that name). Never raises."""
    best_effort(["scancel", *([f"--name={name}"] if name else []), job_id], conf)
