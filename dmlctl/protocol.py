"""Wire formats between the three processes of a run (no torch, no I/O at import).

* **rank → host agent.** Each rank process (the runtime entry, see
  ``dmlctl.runtime.entry``) writes into ``$DMLCTL_RANK_DIR``:

  - ``rank-<R>.stdout`` / ``rank-<R>.stderr`` — the rank's raw output (file
    descriptors 1 and 2 point there, so a rank never blocks on a pipe);
  - ``rank-<R>.events.jsonl`` — one JSON record per line, ``kind`` one of
    ``start`` (rank, local_rank, pid, role), ``metric`` (rank, step, values),
    ``heartbeat`` (progress), ``checkpoint`` (step, dir: from the rank that committed
    a checkpoint in its directory) and ``exit`` (rank, code, error or null).
    :class:`RankEventWriter` writes them.

* **host agent → controller.** The agent prints one JSON object per line on its
  stdout (see :func:`encode_agent_message`); the controller's parser
  (``dmlctl.launch.parser``) turns them into typed events, adding the host name.

Every record carries ``ts`` (seconds since the epoch, float).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

# Environment variables the plan sets for every rank process.
ENV_RUN_ID = "DMLCTL_RUN_ID"
ENV_RANK_DIR = "DMLCTL_RANK_DIR"
ENV_HOST = "DMLCTL_HOST"
ENV_ROLE = "DMLCTL_ROLE"
# Roles of a host's processes by LOCAL_RANK, comma-separated ("worker,worker,server");
# wins over DMLCTL_ROLE (torchrun gives every process of a host the same environment).
ENV_LOCAL_ROLES = "DMLCTL_LOCAL_ROLES"
ROLE_WORKER = "worker"  # a training process
ROLE_SERVER = "server"  # a parameter-server process


_SUMMARY_LINE = re.compile(r"^\s*(rank|exitcode)\s*:|^Root Cause")


def is_failure_summary_line(line: str) -> bool:
    """Whether ``line`` of torchrun's output belongs to its failure summary: a
    ``rank : N`` or ``exitcode : X`` entry, or the "Root Cause" heading."""
    return _SUMMARY_LINE.match(line) is not None


def local_role(environ: Mapping[str, str], local_rank: int, default: str = ROLE_WORKER) -> str:
    """This process's role: its entry of ``DMLCTL_LOCAL_ROLES`` (by ``local_rank``),
    else ``DMLCTL_ROLE``, else ``default``. Raises ``ValueError`` when the list has
    no entry for ``local_rank``."""
    roles = [r.strip() for r in environ.get(ENV_LOCAL_ROLES, "").split(",") if r.strip()]
    if not roles:
        return environ.get(ENV_ROLE) or default
    if not 0 <= local_rank < len(roles):
        raise ValueError(
            f"LOCAL_RANK={local_rank} has no entry in {ENV_LOCAL_ROLES}={','.join(roles)}"
        )
    return roles[local_rank]
ENV_STRATEGY = "DMLCTL_STRATEGY"
ENV_STRATEGY_PARAMS = "DMLCTL_STRATEGY_PARAMS"
ENV_SCRIPT = "DMLCTL_SCRIPT"
ENV_ATTEMPT = "DMLCTL_ATTEMPT"  # 0-based attempt of a restarted run (absent: 0)
ENV_CHECKPOINT_DIR = "DMLCTL_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY_STEPS = "DMLCTL_CHECKPOINT_EVERY_STEPS"
ENV_CHECKPOINT_EVERY_SECONDS = "DMLCTL_CHECKPOINT_EVERY_SECONDS"
ENV_CHECKPOINT_KEEP = "DMLCTL_CHECKPOINT_KEEP"

# Layout of a checkpoint directory (see dmlctl.runtime.checkpoint).
CHECKPOINT_LATEST = "LATEST"  # names the newest committed step directory
CHECKPOINT_MANIFEST = "manifest.json"  # step, world_size, files: {name: {size, sha256}}
CHECKPOINT_STEP_PATTERN = r"^step-(\d{9,})$"

# Kinds of rank records (rank-<R>.events.jsonl).
KIND_START = "start"
KIND_METRIC = "metric"
KIND_EXIT = "exit"
KIND_HEARTBEAT = "heartbeat"  # {progress: int}: the rank is alive; progress grows with work
KIND_CHECKPOINT = "checkpoint"  # {step: int, dir: str}: this rank committed a checkpoint

# Kinds of agent messages (agent stdout).
MSG_LOG = "log"  # {"k": "log", "r": rank|None, "s": "stdout"|"stderr"|"agent", "l": [lines]}
MSG_RANK = "rank"  # {"k": "rank", "rec": <rank record>}
MSG_AGENT = "agent"  # {"k": "agent", "state": "started", "pid": int} | {..., "state": "alive"}
MSG_EXIT = "exit"  # {"k": "exit", "code": int, "tail": [lines]} — the agent's last message


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
        os.makedirs(rank_dir, exist_ok=True)
        self._file: TextIO = open(  # noqa: SIM115 - lives as long as the rank
            rank_events(rank_dir, rank), "a", encoding="utf-8", buffering=1
        )
        self._lock = threading.Lock()  # the heartbeat thread writes too

    def _write(self, record: dict[str, Any]) -> None:
        record["rank"] = self.rank
        record["ts"] = time.time()
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(line)

    def start(self, local_rank: int, role: str, host: str) -> None:
        """Record that this rank's process is up."""
        self._write(
            {"kind": KIND_START, "local_rank": local_rank, "pid": os.getpid(), "role": role,
             "host": host}
        )

    def metric(self, step: int, values: Mapping[str, Any]) -> None:
        """Record one metric sample (values become JSON numbers or strings)."""
        clean = {k: _jsonable(v) for k, v in values.items()}
        self._write({"kind": KIND_METRIC, "step": step, "values": clean})

    def heartbeat(self, progress: int) -> None:
        """Record that the rank is alive and how far it got (a growing counter)."""
        self._write({"kind": KIND_HEARTBEAT, "progress": progress})

    def checkpoint(self, step: int, directory: str) -> None:
        """Record that this rank committed checkpoint ``step`` in ``directory``."""
        self._write({"kind": KIND_CHECKPOINT, "step": step, "dir": directory})

    def exit(self, code: int, error: Mapping[str, Any] | None) -> None:
        """Record the rank's exit: ``error`` is {type, message, traceback: [lines]} or None."""
        self._write({"kind": KIND_EXIT, "code": code, "error": dict(error) if error else None})

    def close(self) -> None:
        with self._lock:
            self._file.close()


def encode_agent_message(kind: str, **fields: Any) -> str:
    """One agent → controller message as a single JSON line (without newline)."""
    fields["k"] = kind
    return json.dumps(fields, separators=(",", ":"))
