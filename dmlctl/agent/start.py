"""Starting a host agent's run: its rank directory (:func:`prepare`), torchrun's
environment (:func:`environment`) and torchrun itself (:func:`start`), forked by the
zygote (which has imported torch already), and the ``exit`` message of a run that could
not start (:func:`cannot_start`)."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import subprocess

from dmlctl import checkpoint_claim, private_files, protocol, run_key, wire
from dmlctl.agent.messages import Emitter
from dmlctl.agent.procs import dies_with_parent
from dmlctl.agent.standin import ENV_STANDIN as STANDIN
from dmlctl.agent.zygote_client import STANDIN as STANDIN_ROLE
from dmlctl.agent.zygote_client import TORCHRUN as TORCHRUN_ROLE
from dmlctl.agent.zygote_client import Client, ZygoteChild
from dmlctl.agent_config import AgentConfig
from dmlctl.failure import FULL_DISK_ERRNOS, Kind

Torchrun = subprocess.Popen[str] | ZygoteChild


def script_dir(config: AgentConfig, workdir: str) -> str:
    """The directory of the training script."""
    return os.path.dirname(os.path.join(workdir, config.torchrun.script))


def environment(config: AgentConfig, rank_dir: str) -> dict[str, str]:
    """torchrun's environment: the agent's, the config's (:meth:`AgentConfig.rank_env`)
    with the rank directory expanded, this dmlctl first on ``PYTHONPATH`` and the stop
    grace as torchrun's shutdown timeout."""
    env = {
        **os.environ,
        **config.rank_env(),
        protocol.ENV_RANK_DIR: rank_dir,
        protocol.ENV_AGENT_PID: str(os.getpid()),
    }
    for key in (protocol.ENV_CHECKPOINT_DIR,):  # remote paths may start with ~/
        if key in env:
            env[key] = os.path.expanduser(env[key])
    if config.key:  # the ranks get the run key's file (written by prepare), not the key
        env[protocol.ENV_RUN_KEY_FILE] = os.path.join(rank_dir, run_key.KEY_FILE)
    # Ranks import the same dmlctl as this agent (on a remote host: the shipped copy).
    here = os.path.dirname(os.path.dirname(os.path.abspath(protocol.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(max(1, math.ceil(config.stop_grace))))
    return env


def start(
    config: AgentConfig,
    workdir: str,
    env: dict[str, str],
    emit: Emitter,
    zygote: Client | None = None,
    warm: bool = False,
) -> Torchrun:
    """torchrun, forked by the ``zygote`` where there is one, else (or where it refuses,
    said in one line) a new process; for a config with ``rejoin``, the stand-in that
    starts those ranks into the running world (:mod:`dmlctl.agent.standin`) instead.
    ``warm`` (``ranks.start: warm``): the zygote forks its ranks too; else torch starts
    them as new interpreters, as under torchrun."""
    argv = config.torchrun.argv()
    role = TORCHRUN_ROLE
    if config.rejoin is not None:
        argv = (config.torchrun.python, "-m", "dmlctl.agent.standin")
        env = {**env, STANDIN: config.rejoin.standin_env(config.torchrun)}
        role = STANDIN_ROLE
    if zygote is not None:
        child = ZygoteChild.fork(zygote, role, argv, workdir, env, warm)
        if not isinstance(child, str):
            if warm:
                emit.send(wire.LogMsg(None, "agent", ("dmlctl agent: warm start",)))
            return child
        said = f"dmlctl agent: torchrun starts as a new process ({child})"
        if warm:
            said = f"dmlctl agent: warm start refused ({child}): torchrun starts as a new process"
        emit.send(wire.LogMsg(None, "agent", (said,)))
    return subprocess.Popen(
        argv,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        preexec_fn=dies_with_parent(signal.SIGKILL, os.getpid()),
    )


# Errors that come and go (out of processes or memory for a moment): the host's fault.
_TRANSIENT = (errno.EAGAIN, errno.ENOMEM, errno.EINTR)


def cannot_start(emit: Emitter, what: str, exc: OSError | ValueError) -> None:
    """The ``exit`` message of an agent that could not start its run, with the error:
    ``DiskFull``, ``AgentExit`` (transient) or ``SpecInvalid`` — the planned command,
    environment or directory cannot work (a restart would fail the same way)."""
    code = exc.errno if isinstance(exc, OSError) else None
    name, kind = (
        ("DiskFull", Kind.DISK_FULL)
        if code in FULL_DISK_ERRNOS
        else ("AgentExit", Kind.AGENT)
        if code in _TRANSIENT
        else ("SpecInvalid", Kind.SPEC)
    )
    message = f"{what}: {exc}"
    error = {"type": name, "message": message, "kind": kind.value}
    emit.send(wire.ExitMsg(127, (message,), error=error))


_CLAIMS: list[int | None] = []
"""The agent's claim of its host's checkpoint directory, held until it exits."""


def prepare(config: AgentConfig, emit: Emitter) -> str | None:
    """The rank directory (``~`` expanded, made private) holding ``agent.pid``; None
    (after the ``exit`` message saying why) when it cannot be made, or when the
    checkpoint directory is claimed by another run (:mod:`dmlctl.checkpoint_claim`).
    The checkpoint directory is made and claimed for the run when it can be (the
    ranks never make it again once it was there: see
    :class:`dmlctl.runtime.checkpoint.CheckpointManager`)."""
    rank_dir = os.path.expanduser(config.rank_dir)
    checkpoints = config.rank_env().get(protocol.ENV_CHECKPOINT_DIR)
    if checkpoints and config.rank_env().get(protocol.ENV_CHECKPOINT_CLAIM) != "1":
        with contextlib.suppress(OSError):  # the ranks say why, at their first save
            private_files.make_private_dirs(os.path.expanduser(checkpoints))
    elif checkpoints:
        try:
            _CLAIMS.append(
                checkpoint_claim.claim(
                    checkpoint_claim.where(checkpoints, config.workdir), config.run_id
                )
            )
        except checkpoint_claim.CheckpointInUse as e:
            cannot_start(emit, "the checkpoint directory is another run's", ValueError(str(e)))
            return None
        except OSError:  # the ranks say why, at their first save
            pass
    try:
        private_files.make_private_dirs(rank_dir)
        if config.key:
            run_key.write_key(rank_dir, config.key)
        path = os.path.join(rank_dir, "agent.pid")
        with open(path, "w", encoding="ascii", opener=private_files.private_opener) as f:
            f.write(f"{os.getpid()}\n")
    except OSError as e:
        cannot_start(emit, f"cannot make the rank directory {rank_dir}", e)
        return None
    return rank_dir
