"""Wire formats between the three processes of a run (no torch, no I/O at import).

* **rank → host agent.** Each rank process (the runtime entry, see
  ``dmlctl.runtime.entry``) writes into ``$DMLCTL_RANK_DIR``:

  - ``rank-<R>.stdout`` / ``rank-<R>.stderr`` — the rank's raw output (file
    descriptors 1 and 2 point there, so a rank never blocks on a pipe);
  - ``rank-<R>.events.jsonl`` — one JSON record per line, ``kind`` one of
    ``start`` (rank, local_rank, pid, role, main thread id), ``metric`` (rank, step,
    values), ``heartbeat`` (liveness and progress, see :data:`BEAT_KEYS`),
    ``checkpoint`` (step, dir: from the rank that committed a checkpoint in its
    directory), ``prepared`` (strategy: the script let the strategy wrap its model) and
    ``exit`` (rank, code, error or null, final collective counts). :class:`RankEventWriter`
    writes them.
  - ``rank-<R>.stacks`` — Python stacks of every thread, written by ``faulthandler``
    when the rank gets :data:`STACKS_SIGNAL` (the host agent sends it on a hang).

* **controller → host agent.** The first line of the agent's stdin is its
  :class:`~dmlctl.agent_config.AgentConfig`, as JSON; later lines are commands
  (``stop [GRACE]``, ``dump``).

* **host agent → controller.** The agent prints one JSON object per line on its
  stdout (:mod:`dmlctl.wire`: one type per message); the controller's parser
  (``dmlctl.runs.parser``) turns them into typed events, adding the host name.

Every record carries ``ts`` (seconds since the epoch, float).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

from dmlctl.private_files import make_private_dirs, private_opener

# Environment variables the plan sets for every rank process.
ENV_RUN_ID = "DMLCTL_RUN_ID"
#: The job's ``ranks.start``: ``fresh`` (absent too) or ``warm`` (:mod:`dmlctl.agent.zygote`).
ENV_RANK_START = "DMLCTL_RANK_START"
RANK_START_WARM = "warm"
ENV_RANK_DIR = "DMLCTL_RANK_DIR"
DELETED_WHILE_RUNNING = "was deleted while the run ran"
"""What a rank's error says of its checkpoint directory gone with the run directory:
a consequence (``dmlctl.runs.events``' collateral markers), the deletion the cause."""
ENV_AGENT_PID = "DMLCTL_AGENT_PID"  # the host agent's pid, as the ranks' torchrun sees it
ENV_HOST = "DMLCTL_HOST"
ENV_ROLE = "DMLCTL_ROLE"
# Roles of a host's processes by LOCAL_RANK, comma-separated ("worker,worker,server");
# wins over DMLCTL_ROLE (torchrun gives every process of a host the same environment).
ENV_LOCAL_ROLES = "DMLCTL_LOCAL_ROLES"
ROLE_WORKER = "worker"  # a training process
ROLE_SERVER = "server"  # a parameter-server process


def local_roles(environ: Mapping[str, str]) -> list[str]:
    """Every local rank's role from ``DMLCTL_LOCAL_ROLES`` (empty without it)."""
    return [r.strip() for r in environ.get(ENV_LOCAL_ROLES, "").split(",") if r.strip()]


def local_role(environ: Mapping[str, str], local_rank: int, default: str = ROLE_WORKER) -> str:
    """This process's role: its entry of ``DMLCTL_LOCAL_ROLES`` (by ``local_rank``),
    else ``DMLCTL_ROLE``, else ``default``. Raises ``ValueError`` when the list has
    no entry for ``local_rank``."""
    roles = local_roles(environ)
    if not roles:
        return environ.get(ENV_ROLE) or default
    if not 0 <= local_rank < len(roles):
        raise ValueError(
            f"LOCAL_RANK={local_rank} has no entry in {ENV_LOCAL_ROLES}={','.join(roles)}"
        )
    return roles[local_rank]


ENV_STRATEGY = "DMLCTL_STRATEGY"
DEFAULT_STRATEGY = "ssgd"  # a job file that names no strategy trains with this one
ENV_STRATEGY_PARAMS = "DMLCTL_STRATEGY_PARAMS"
ENV_SCRIPT = "DMLCTL_SCRIPT"
#: The job's ``backend:`` (:data:`dmlctl.gpus.BACKENDS`); absent: ``auto``.
ENV_BACKEND = "DMLCTL_BACKEND"
#: The job's ``parallelism:`` block, resolved (:func:`dmlctl.mesh.dumps`), and its
#: ``parallelize: FILE:FUNCTION``; absent without them.
ENV_PARALLELISM = "DMLCTL_PARALLELISM"
ENV_PARALLELIZE = "DMLCTL_PARALLELIZE"
ENV_STRAGGLER = "DMLCTL_STRAGGLER"  # benchmarks: the last worker runs this many times slower
ENV_ATTEMPT = "DMLCTL_ATTEMPT"  # 1-based attempt: 1 on the first, as the dashboard counts
#: ``restart.mode: in_place`` (absent: ``full``): a worker killed by SIGKILL is forked
#: again in place, at most ``DMLCTL_RESPAWNS`` times per rank; the replacement has
#: ``DMLCTL_REJOIN`` set (to its number, 1 for the first) and joins the running world.
ENV_RESTART_MODE = "DMLCTL_RESTART_MODE"
ENV_RESPAWNS = "DMLCTL_RESPAWNS"
ENV_RESPAWN_SERVERS = "DMLCTL_RESPAWN_SERVERS"  # "1": in place, servers replaced too
ENV_PS_SNAPSHOT_EVERY = "DMLCTL_PS_SNAPSHOT_EVERY"  # a replaceable server's snapshot, pushes
ENV_PS_SNAPSHOT_COPY = "DMLCTL_PS_SNAPSHOT_COPY"  # "1": a copy in the store (spare hosts)
ENV_REJOIN = "DMLCTL_REJOIN"
ENV_RUN_STORE = "DMLCTL_RUN_STORE"  # host:port of the controller's store (in place), if any
ENV_RUN_KEY_FILE = "DMLCTL_RUN_KEY_FILE"  # the run key's file (dmlctl.run_key), not the key
ENV_REJOIN_WAIT = "DMLCTL_REJOIN_WAIT"  # restart.rejoin_wait (0: never go on smaller)
IN_PLACE = "in_place"
ENV_CHECKPOINT_DIR = "DMLCTL_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY_STEPS = "DMLCTL_CHECKPOINT_EVERY_STEPS"
ENV_CHECKPOINT_EVERY_SECONDS = "DMLCTL_CHECKPOINT_EVERY_SECONDS"
ENV_CHECKPOINT_KEEP = "DMLCTL_CHECKPOINT_KEEP"
ENV_CHECKPOINT_ALLOW_FRESH = "DMLCTL_CHECKPOINT_ALLOW_FRESH"  # "1": checkpoint.allow_fresh_start
ENV_CHECKPOINT_WARM_START = "DMLCTL_CHECKPOINT_WARM_START"  # "1": checkpoint.warm_start
ENV_CHECKPOINT_CLAIM = "DMLCTL_CHECKPOINT_CLAIM"  # "1": the job named its dir: claim it


def restarts_before(environ: Mapping[str, str]) -> int:
    """The restarts of the run before the attempt that gave a process ``environ``
    (:data:`ENV_ATTEMPT` less one; 0 without it): torchrun's ``TORCHELASTIC_RESTART_COUNT``."""
    try:
        return max(0, int(environ.get(ENV_ATTEMPT, "1")) - 1)
    except ValueError:
        return 0


def in_place(environ: Mapping[str, str]) -> bool:
    """Whether the run that gave a rank ``environ`` replaces lost workers in place."""
    return environ.get(ENV_RESTART_MODE) == IN_PLACE


# Layout of a checkpoint directory (see dmlctl.runtime.checkpoint).
CHECKPOINT_LATEST = "LATEST"  # names the newest committed step directory
CHECKPOINT_MANIFEST = "manifest.json"  # step, world_size, files: {name: {size, sha256}}
CHECKPOINT_STEP_PATTERN = r"^step-(\d{9,})$"

# Kinds of rank records (rank-<R>.events.jsonl).
KIND_START = "start"
KIND_METRIC = "metric"
KIND_EXIT = "exit"
KIND_HEARTBEAT = "heartbeat"  # the rank is alive; BEAT_KEYS say what it is doing
KIND_CHECKPOINT = "checkpoint"  # {step: int, dir: str}: this rank committed a checkpoint
KIND_PREPARED = "prepared"  # {strategy: str}: ctx.prepare() applied the job's strategy
KIND_RESPAWN = "respawn"  # {code, pid}: the rank's process died (code) and was forked again
_KIND_PREFIX = '{"kind":"'


def record_kind(line: str) -> str | None:
    """The ``kind`` of a rank record as :class:`RankEventWriter` writes it (its first
    key), without decoding the rest; None for a line that is not such a record. A
    value a script logged (``ctx.log(kind="exit")``) is never mistaken for it."""
    if not line.startswith(_KIND_PREFIX):
        return None
    end = line.find('"', len(_KIND_PREFIX))
    return line[len(_KIND_PREFIX) : end] if end > 0 else None


# What a heartbeat record carries besides kind/rank/ts (all optional but progress):
#   progress  int    batches and log calls so far (grows while the rank trains)
#   armed     bool   training steps are under way: no phase, data not exhausted
#   since     float  seconds since the last step
#   phase     str    the phase the script declared (ctx.phase), or absent
#   phase_s   float  seconds since that phase began
#   limit     float  that phase's own time limit in seconds, or absent
#   step_s    float  the slowest of the rank's recent steps, in seconds
#   where     str    innermost frame of the script's own code in the main thread
#   inner     str    innermost frame of the main thread (what it is blocked in)
#   coll      {group: [entered, completed, op, age, size]}  collectives per process
#             group: the last one entered and completed, the oldest still pending (its
#             op name and seconds since it was entered) or nulls, the group's size; a
#             group's NCCL collectives (numbered apart from gloo's) are the row
#             "<group>/nccl" (NCCL_SUFFIX)
BEAT_KEYS = (
    "progress",
    "armed",
    "since",
    "phase",
    "phase_s",
    "limit",
    "step_s",
    "where",
    "inner",
    "coll",
    "stage",  # before the first step: joining | first step | importing; a server: serving
)

STAGE_SERVING = "serving"
"""The ``stage`` a parameter server's heartbeats carry once it serves (it never steps)."""

# Cumulative communication totals a strategy's meter adds to a metric record's values,
# all counted since the meter started in this rank process: bytes sent, seconds spent
# communicating, optimizer steps, wall seconds. The controller divides them for the
# run's averages; a record without them (an older dmlctl) has only the window values.
PROGRESS = "progress"
"""Metric key the runtime adds to a record: the share of the training done, 0 to 1
(from ``ctx.shard``'s epochs, or ``ctx.total_steps``); ``epoch`` is added with it."""

COMM_TOTALS = ("comm_bytes_total", "comm_seconds_total", "comm_steps_total", "comm_wall_total")

# faulthandler dumps every thread's stack into rank-<R>.stacks on this signal.
STACKS_SIGNAL = "SIGUSR2"

# PyTorch's flight recorder (every rank's record of its collectives; the hang detector
# reads it): its size variables, and the size the plan sets when the job sets none.
FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_DEFAULT_SIZE = "200"
NCCL_SUFFIX = "/nccl"  # a group's row of NCCL collectives in a heartbeat's "coll"


def checkpoint_step_dir(step: int) -> str:
    """Name of checkpoint ``step``'s directory."""
    return f"step-{step:09d}"


def rank_file(rank: int) -> str:
    """Name of rank ``rank``'s file inside a checkpoint step directory."""
    return f"rank-{rank}.pt"


def rank_stdout(rank_dir: str, rank: int) -> str:
    """Path of rank ``rank``'s stdout file inside ``rank_dir``."""
    return os.path.join(rank_dir, f"rank-{rank}.stdout")


def rank_stderr(rank_dir: str, rank: int) -> str:
    """Path of rank ``rank``'s stderr file inside ``rank_dir``."""
    return os.path.join(rank_dir, f"rank-{rank}.stderr")


def rank_stacks(rank_dir: str, rank: int) -> str:
    """Path of rank ``rank``'s stack dump file inside ``rank_dir``."""
    return os.path.join(rank_dir, f"rank-{rank}.stacks")


def rank_position(rank_dir: str, rank: int, attempt: str) -> str:
    """Where worker ``rank`` keeps its data position in attempt ``attempt`` of a run
    that replaces workers in place (:class:`dmlctl.runtime.rejoin.Position`)."""
    return os.path.join(rank_dir, f"rank-{rank}.attempt-{attempt}.position")


def rank_finished(rank_dir: str, rank: int, attempt: str) -> str:
    """The mark worker ``rank`` leaves once its part of attempt ``attempt`` is over
    (then its death is not replaced in place: :mod:`dmlctl.agent.respawn`)."""
    return os.path.join(rank_dir, f"rank-{rank}.attempt-{attempt}.finished")


def rank_trained(rank_dir: str, rank: int, attempt: str) -> str:
    """The mark worker ``rank`` leaves at the end of its data in attempt ``attempt``
    (its final model done): a death after it is not replaced in place either."""
    return os.path.join(rank_dir, f"rank-{rank}.attempt-{attempt}.trained")


def rank_snapshot(rank_dir: str, rank: int, attempt: str) -> str:
    """Where parameter server ``rank`` keeps its state in attempt ``attempt`` for its
    replacement in place (:mod:`dmlctl.ps.snapshots`)."""
    return os.path.join(rank_dir, f"rank-{rank}.attempt-{attempt}.snapshot")


def torchrun_failures(rank_dir: str, attempt: str) -> str:
    """Where torchrun writes down its failed ranks in attempt ``attempt`` (1-based, as
    :data:`ENV_ATTEMPT` says it): :mod:`dmlctl.agent.torchrun`, read by the agent."""
    return os.path.join(rank_dir, f"torchrun-failures-{attempt}.json")


def rank_events(rank_dir: str, rank: int) -> str:
    """Path of rank ``rank``'s record file inside ``rank_dir``."""
    return os.path.join(rank_dir, f"rank-{rank}.events.jsonl")


def _jsonable(value: Any) -> float | int | str | bool | None:
    """Turn a metric value (python number, 0-d tensor, numpy scalar) into JSON."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    item = getattr(value, "item", None)
    if callable(item):
        out = item()
        if isinstance(out, bool | int | float):
            return out
    return float(value)


class RankEventWriter:
    """Appends rank records to ``rank-<R>.events.jsonl``; each record is flushed at once.

    Promise: a record is either absent or a complete line (one ``write`` call per
    record on a line-buffered file opened in append mode).
    """

    def __init__(self, rank_dir: str, rank: int) -> None:
        self.rank = rank
        make_private_dirs(rank_dir)
        self._file: TextIO = open(  # noqa: SIM115 - lives as long as the rank
            rank_events(rank_dir, rank),
            "a",
            encoding="utf-8",
            buffering=1,
            opener=private_opener,
        )
        self._lock = threading.Lock()  # the heartbeat thread writes too

    def _write(self, record: dict[str, Any]) -> None:
        """One line: ``kind`` first (:func:`record_kind` reads it there), then the rest."""
        record["rank"] = self.rank
        record["ts"] = time.time()
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(line)

    def start(self, local_rank: int, role: str, host: str) -> None:
        """Record that this rank's process is up (and which thread is its main one,
        and the run's store, ``MASTER_ADDR:MASTER_PORT``, where torchrun gave one)."""
        store = [os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")]
        self._write(
            {
                "kind": KIND_START,
                "local_rank": local_rank,
                "pid": os.getpid(),
                "role": role,
                "host": host,
                "main_thread": threading.main_thread().ident,
                **({"store": f"{store[0]}:{store[1]}"} if all(store) else {}),
            }
        )

    def metric(self, step: int, values: Mapping[str, Any]) -> None:
        """Record one metric sample (values become JSON numbers or strings)."""
        clean = {k: _jsonable(v) for k, v in values.items()}
        self._write({"kind": KIND_METRIC, "step": step, "values": clean})

    def heartbeat(self, beat: Mapping[str, Any]) -> None:
        """Record that the rank is alive and what it does (keys: :data:`BEAT_KEYS`)."""
        self._write({"kind": KIND_HEARTBEAT, **beat})

    def prepared(self, strategy: str) -> None:
        """Record that the script let ``strategy`` wrap its model and optimizer."""
        self._write({"kind": KIND_PREPARED, "strategy": strategy})

    def respawn(self, code: int, pid: int) -> None:
        """Record that this rank's process died with ``code`` and was started again
        in place (written by the torchrun that forks it; ``pid`` the new process)."""
        self._write({"kind": KIND_RESPAWN, "code": code, "pid": pid})

    def checkpoint(self, step: int, directory: str) -> None:
        """Record that this rank committed checkpoint ``step`` in ``directory``."""
        self._write({"kind": KIND_CHECKPOINT, "step": step, "dir": directory})

    def exit(
        self, code: int, error: Mapping[str, Any] | None, coll: Mapping[str, Any] | None = None
    ) -> None:
        """Record the rank's exit: ``error`` is {type, message, traceback: [lines]} or
        None; ``coll`` its final collective counts (rows as in a heartbeat), if known."""
        record: dict[str, Any] = {
            "kind": KIND_EXIT,
            "code": code,
            "error": dict(error) if error else None,
        }
        if coll:
            record["coll"] = dict(coll)
        self._write(record)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (a closed writer drops what it is given)."""
        return self._file.closed

    def close(self) -> None:
        with self._lock:
            self._file.close()


_RANK_WRITERS: dict[tuple[str, int], RankEventWriter] = {}
_RANK_WRITERS_LOCK = threading.Lock()


def rank_event_writer(rank_dir: str, rank: int) -> RankEventWriter:
    """This process's one writer of rank ``rank``'s records in ``rank_dir`` (opened at
    the first call, from any thread): the rank's start, heartbeats, metrics and exit
    all go through it, under its one lock, so two writers never append to the same
    file. The rank's entry point closes it once its exit record is written; records
    given after that (an atexit handler that logs) go to a writer opened again."""
    key = (os.path.abspath(rank_dir), rank)
    with _RANK_WRITERS_LOCK:
        writer = _RANK_WRITERS.get(key)
        if writer is None or writer.closed:
            writer = _RANK_WRITERS[key] = RankEventWriter(rank_dir, rank)
        return writer
