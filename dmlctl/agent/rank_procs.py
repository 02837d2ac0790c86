"""The ranks of one host's attempt, as processes dmlctl's elastic agent starts itself.

torch's own process context serves a run whose ranks start as new interpreters and
whose failures restart it whole: there :class:`~dmlctl.agent.elastic_agent.DmlctlAgent`
leaves the ranks to torch. It cannot serve two cases, and :class:`RankProcesses` does:

* ``restart.mode: in_place``: torch's context stops every rank as soon as one fails.
  Here a worker killed by SIGKILL is started again while the others go on
  (:mod:`dmlctl.agent.respawn` says which), and torch's agent sees one rank that
  never stopped.
* ``ranks.start: warm``: each rank is forked by the zygote
  (:mod:`dmlctl.agent.zygote`), not started as a new interpreter.

A rank is started from the same command and environment either way, and each one
runs in a session of its own, as torch starts it (signals go to its process group).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dmlctl.agent import respawn

POLL_S = 0.05
log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
"""torch's logger of its process context: the same lines, under the same name (the
host agent reads a failure report from them, as users' tools may)."""


class RankProcess(Protocol):
    """One started rank: its pid, its exit code once it has ended (``-N``: killed by
    signal N), and a way to signal its process group."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def signal(self, sig: int) -> None: ...


class Starter(Protocol):
    """Starts a rank from its command and its whole environment."""

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> RankProcess: ...


class NewInterpreter:
    """A rank as a new interpreter (:class:`subprocess.Popen`), as torch starts one."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self._proc = subprocess.Popen(list(argv), env=dict(env), start_new_session=True)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def poll(self) -> int | None:
        return self._proc.poll()

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)


class FreshStarter:
    """Starts each rank as a new interpreter."""

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> RankProcess:
        return NewInterpreter(argv, env)


@dataclass
class _Rank:
    """One local rank: what started it, its process now, its exit code once final."""

    argv: tuple[str, ...]
    env: dict[str, str]
    proc: RankProcess
    respawns: int = 0
    code: int | None = None


class RankProcesses:
    """Every rank of one attempt on this host, by local rank.

    :meth:`ended` gives each rank's final exit code once it has one. A rank that
    :mod:`dmlctl.agent.respawn` lets be replaced is started again instead (its
    ``respawn`` record written) and is still running; once :meth:`close` was called
    none is started again."""

    def __init__(
        self,
        starter: Starter,
        commands: Mapping[int, tuple[Sequence[str], Mapping[str, str]]],
        respawn_lost: bool,
    ) -> None:
        self._starter = starter
        self._respawn = respawn_lost
        self._closing = False
        self._ranks: dict[int, _Rank] = {}
        for local_rank, (argv, env) in sorted(commands.items()):
            proc = starter.start(argv, env)
            self._ranks[local_rank] = _Rank(tuple(argv), dict(env), proc)

    def pids(self) -> dict[int, int]:
        """Each local rank's current pid."""
        return {local_rank: r.proc.pid for local_rank, r in self._ranks.items()}

    def envs(self) -> dict[int, dict[str, str]]:
        """Each local rank's environment, as it was first started."""
        return {local_rank: r.env for local_rank, r in self._ranks.items()}

    def ended(self) -> dict[int, int]:
        """The final exit code of every rank that has one (local rank → code)."""
        for rank in self._ranks.values():
            if rank.code is None:
                self._look(rank)
        return {lr: r.code for lr, r in self._ranks.items() if r.code is not None}

    def _look(self, rank: _Rank) -> None:
        code = rank.proc.poll()
        if code is None:
            return
        if not self._closing and respawn.over_before(rank.env, code):
            code = 0
        elif self._replaces(rank, code):
            rank.respawns += 1
            rank.proc = self._starter.start(rank.argv, respawn.rejoin_env(rank.env, rank.respawns))
            respawn.record(rank.env, code, rank.proc.pid)
            return
        if code != 0:
            pid, binary = rank.proc.pid, rank.argv[0]
            local = rank.env.get("LOCAL_RANK")
            log.error(
                "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s",
                code,
                local,
                pid,
                binary,
            )
        rank.code = code

    def _replaces(self, rank: _Rank, code: int) -> bool:
        """Whether ``rank``, ended with ``code``, is started again in place."""
        return (
            self._respawn
            and not self._closing
            and respawn.may_respawn(rank.env, code, rank.respawns)
        )

    def close(self, death_sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Stop every rank still running: ``death_sig`` to its process group, SIGKILL
        after ``timeout`` seconds; returns once each has ended."""
        self._closing = True
        running = [r for r in self._ranks.values() if r.code is None and r.proc.poll() is None]
        for rank in running:
            log.warning("Sending process %s closing signal %s", rank.proc.pid, _name(death_sig))
            rank.proc.signal(death_sig)
        deadline = time.monotonic() + timeout
        while any(r.proc.poll() is None for r in running):
            if time.monotonic() >= deadline:
                for rank in running:
                    rank.proc.signal(signal.SIGKILL)
                deadline = float("inf")
            time.sleep(POLL_S)
        self.ended()


def _name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def shutdown_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """How long stopped ranks get before SIGKILL: torch's ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``
    (the agent sets it to the job's stop grace), else torch's 30 s."""
    try:
        return float(environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
    except ValueError:
        print("dmlctl: TORCH_ELASTIC_SHUTDOWN_TIMEOUT is not a number: 30 s", file=sys.stderr)
        return 30.0
