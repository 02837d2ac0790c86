"""How commands reach a node of a run's Slurm allocation: each is one ``srun`` step
on that node (``--overlap``, so steps share the allocation's CPUs and GPUs), run by a
shell that first runs the cluster's ``slurm.setup`` and then goes to the command's
directory. ``srun`` passes stdin to the step and its stdout back, so the host agent
and code sync run over it exactly as over SSH.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dmlctl.slurm import allocation, steps
from dmlctl.slurm.commands import require, slurm_env
from dmlctl.transport import Reachable, Transport, make_transports
from dmlctl.transport.base import Command, Outcome, remote_command
from dmlctl.transport.local import LocalProcess, LocalTransport

SETUP_FAILED = 97
"""Exit code of a command whose node's ``slurm.setup`` failed (its output on stderr)."""
KILL_WAIT_S = 10.0
"""How long a stopped step's ``srun`` gets to end its step before it is SIGKILLed."""


@dataclass(frozen=True)
class Node:
    """Where a host of the plan is: ``node`` of allocation ``job_id`` (Slurm configured
    by ``conf``), with ``gpus`` GPUs for each step and ``setup`` run before each."""

    job_id: str
    node: str
    conf: str | None = None
    gpus: int = 0
    setup: str | None = None

    def srun(self, step_name: str) -> list[str]:
        """The ``srun`` prefix of one step on this node."""
        gpus = [f"--gpus-per-node={self.gpus}"] if self.gpus else []
        return [
            "srun",
            f"--jobid={self.job_id}",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={self.node}",
            "--overlap",
            "--quiet",
            f"--job-name={step_name}",
            *gpus,
        ]

    def command(self, argv: Sequence[str], cwd: str | None, step_name: str) -> list[str]:
        """The whole command line that runs ``argv`` in ``cwd`` on this node."""
        line = remote_command(argv, cwd)
        if not self.setup:
            return [*self.srun(step_name), "sh", "-c", line]
        # setup's output would mix with the command's (a protocol on stdout); a setup
        # that fails stops the command, with its words on stderr.
        script = f"{{ {self.setup}\n}} >&2 || exit {SETUP_FAILED}\n{line}"
        return [*self.srun(step_name), "sh", "-c", script]

    @staticmethod
    def of(where: allocation.Allocation, host: str) -> Node:
        """Where ``host`` of a plan is in its allocation."""
        return Node(where.job_id, where.nodes[host], where.conf, where.gpus, where.setup)


class SrunProcess(LocalProcess):
    """A command running as an ``srun`` step: stopping it cancels the step on its
    node, not only the ``srun`` here."""

    def __init__(self, host: str, node: Node, argv: Sequence[str], step_name: str) -> None:
        self._node, self._step = node, step_name
        super().__init__(host, argv, None, env=slurm_env(node.conf))

    def alive_here(self) -> bool:
        """False: the command runs on a node (silence there may be a lost node)."""
        return False

    def kill(self) -> None:
        """End the step, without waiting: ``srun`` SIGTERMed cancels it (the node's
        ``slurmstepd`` signals every process of it); one that has not ended after
        :data:`KILL_WAIT_S` (its node may not answer) is SIGKILLed and the step
        cancelled by its name, unique to it, in the background."""
        if not self.alive_locally():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        threading.Thread(target=self._finish_kill, daemon=True).start()

    def alive_locally(self) -> bool:
        """Whether this ``srun`` still runs here (not yet reaped: its pid is its own)."""
        return super().alive_here()

    def _finish_kill(self) -> None:
        if self.wait(KILL_WAIT_S) is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        steps.cancel_step(self._node.job_id, self._step, self._node.conf)


class SrunTransport(Transport):
    """Runs commands on one node of a run's allocation (see the module docstring)."""

    def __init__(self, host: str, node: Node) -> None:
        self.host, self.node = host, node
        self._local = LocalTransport(host, env=slurm_env(node.conf))
        self.route = " ".join(node.srun(f"dmlctl-agent-{host}"))
        require("srun")

    def execute(self, command: Command) -> Outcome:
        """``command`` run to its end in a step of its own on the node; a step that
        outlives ``command.timeout`` is cancelled too."""
        step = steps.step_name(self.host)
        full = self.node.command(command.argv, command.cwd, step)
        outcome = self._local.execute(dataclasses.replace(command, argv=tuple(full), cwd=None))
        if outcome[0] == 124:  # srun outlived its timeout: its step goes too
            where = (self.node.job_id, step, self.node.conf)
            threading.Thread(target=steps.cancel_step, args=where, daemon=True).start()
        return outcome

    def start(self, argv: Sequence[str], *, cwd: str | None = None) -> SrunProcess:
        step = steps.step_name(f"agent-{self.host}")
        return SrunProcess(self.host, self.node, self.node.command(argv, cwd, step), step)


def transports_for(
    hosts: Iterable[Reachable], where: allocation.Allocation | None
) -> dict[str, Transport]:
    """A run's transports: ``srun`` for the nodes of its allocation ``where``, the
    usual ones (:func:`~dmlctl.transport.make_transports`) for every other host."""
    hosts = list(hosts)
    nodes = where.nodes if where is not None else {}
    out = make_transports(h for h in hosts if h.name not in nodes)
    for host in hosts:
        if where is not None and host.name in nodes:  # (nodes is empty without where)
            out[host.name] = SrunTransport(host.name, Node.of(where, host.name))
    return out
