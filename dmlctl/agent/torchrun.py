"""``python -m dmlctl.agent.torchrun ARGS``: torchrun (``python -m
torch.distributed.run ARGS``, the same command line) run with dmlctl's elastic agent,
which writes down the ranks that failed, typed.

The arguments are torchrun's, read by torchrun's own parser into torch's
``LaunchConfig``; the agent is :class:`~dmlctl.agent.elastic_agent.DmlctlAgent`, a
subclass of torch's, and the rendezvous dmlctl's registered backend
(:mod:`dmlctl.agent.rendezvous`). When ranks fail, :func:`run` writes torch's record
of each one (global rank, exit code, negative for the signal that killed it, pid,
and when) to ``torchrun-failures-<attempt>.json`` in the host's rank directory
(:func:`dmlctl.protocol.torchrun_failures`) before it raises torch's
``ChildFailedError``, so torchrun's report is printed as always; the host agent sends
the record with its exit message (:func:`read_failures`), and the controller judges
the failed rank from it instead of from the printed report.

With ``ranks.start: warm`` the ranks are forked by the zygote this process was
forked from (:mod:`dmlctl.agent.zygote`, which passes :func:`run` its client).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dmlctl import protocol, wire


def run(argv: Sequence[str], starter: Any = None) -> None:
    """torchrun's ``main(argv)`` with dmlctl's agent; its failed ranks written down
    first when they fail (then torch's ``ChildFailedError`` is raised, as torchrun
    raises it). ``starter``: what starts the ranks (None: torch, or new interpreters)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import config_from_args, get_args_parser

    from dmlctl.agent import elastic_agent, rendezvous

    rendezvous.register()
    args = get_args_parser().parse_args(with_log_dir(argv))
    config, entrypoint, entry_args = config_from_args(args)
    if not isinstance(entrypoint, str):
        raise SystemExit("dmlctl: the ranks run a command (torchrun's --no-python is not used)")
    count = protocol.restarts_before(os.environ)
    agent = elastic_agent.make_agent(config, entrypoint, entry_args, count, starter)
    result = elastic_agent.run_agent(agent, config)
    if result.is_failed():
        write_failures(result.failures)
        name = elastic_agent.entrypoint_name(entrypoint, entry_args)
        raise ChildFailedError(name=name, failures=result.failures)


LOG_DIR = "torchrun"
"""torchrun's log directory in the host's rank directory (its ranks' error files)."""


def with_log_dir(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """``argv`` (dmlctl's torchrun command, which names no log directory) with
    torchrun's ``--log-dir`` in the host's rank directory, where the run keeps it with
    its ranks' error files (``dmlctl logs --fetch`` brings it); ``argv`` unchanged
    without a rank directory (a plain torchrun). Left to itself torchrun makes a new
    ``torchelastic_*`` directory in the host's temporary directory on every start and
    never removes it."""
    rank_dir = environ.get(protocol.ENV_RANK_DIR)
    if not rank_dir:
        return list(argv)
    return ["--log-dir", os.path.join(rank_dir, LOG_DIR), *argv]


def write_failures(failures: Mapping[int, Any], environ: Mapping[str, str] = os.environ) -> None:
    """Write torchrun's ``failures`` (global rank → ``ProcessFailure``) where the agent
    of this attempt reads them; nothing without a rank directory (a plain torchrun)
    or when it cannot be written (the agent then reads torchrun's report)."""
    rank_dir = environ.get(protocol.ENV_RANK_DIR)
    if not rank_dir:
        return
    records = [
        wire.RankFailure(int(rank), int(f.exitcode), int(f.pid), float(f.timestamp))
        for rank, f in sorted(failures.items())
    ]
    path = protocol.torchrun_failures(rank_dir, environ.get(protocol.ENV_ATTEMPT, "1"))
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            out.write(wire.encode_failures(records))
        os.replace(path + ".tmp", path)
    except OSError:  # a full disk: no half-written file left behind
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")


def read_failures(rank_dir: str, attempt: str) -> tuple[wire.RankFailure, ...]:
    """The failed ranks torchrun wrote down in ``attempt`` (empty when it wrote none,
    or what it wrote cannot be read)."""
    try:
        with open(protocol.torchrun_failures(rank_dir, attempt), encoding="utf-8") as f:
            return wire.decode_failures(json.load(f))
    except (OSError, ValueError):
        return ()


def main(argv: Sequence[str], starter: Any = None) -> None:
    """:func:`run` under torch's ``@record``: an error of the agent itself is written to
    torchrun's own error file, as torchrun's ``main`` does."""
    from torch.distributed.elastic.multiprocessing.errors import record

    record(run)(argv, starter)


if __name__ == "__main__":
    main(sys.argv[1:])
