"""``python -m dmlctl.agent.torchrun ARGS``: torchrun (``python -m
torch.distributed.run ARGS``) that writes down the ranks that failed, typed.

When ranks fail, torchrun raises its ``ChildFailedError`` holding its own record of
each one: global rank, exit code (negative: the signal that killed it), pid, and when
(read from the rank's error file, ``TORCHELASTIC_ERROR_FILE``, when the rank wrote
one). Before torchrun prints its report and exits as it always does, :func:`run`
writes that record to ``torchrun-failures-<attempt>.json`` in the host's rank
directory (:func:`dmlctl.protocol.torchrun_failures`); the host agent sends it with
its exit message (:func:`read_failures`), and the controller judges the failed rank
from it instead of from torchrun's printed report. A warm agent's forked torchrun
runs the same :func:`run`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dmlctl import protocol, wire


def run(argv: Sequence[str]) -> None:
    """torchrun's ``main(argv)``; its failed ranks written down first when they fail
    (its ``ChildFailedError`` then goes on as it would)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    outside = os.environ.get(protocol.ENV_RUN_STORE)
    if outside:
        meet_at_outside_store(outside)
    if protocol.in_place(os.environ):
        wait_for_ranks_at_exit(linger=not outside)
    try:
        main(with_log_dir(argv))
    except ChildFailedError as e:
        write_failures(e.failures)
        raise


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


EXIT_WAIT_S = 60.0
"""How long a torchrun of an in-place run waits at its end for every rank of the world
to be done with the run's store."""
EXIT_CONNECT_S = 3.0
"""How long a torchrun at its end tries to reach the run's store: one that cannot has
lost the race with the store's torchrun, which ends once every rank is done."""
EXIT_LINGER_S = 1.0
"""How long the store's torchrun (node 0) stays after every rank is done, so that the
other nodes' torchruns, a monitor interval behind, still find it at their end."""


def meet_at_outside_store(endpoint: str) -> None:
    """Make torchrun hand its ranks the run's store at ``endpoint`` (``host:port``, the
    controller's, :mod:`dmlctl.provision.store_server`) as ``MASTER_ADDR:MASTER_PORT``.

    torchrun meets the other nodes at its ``--rdzv-endpoint`` (the same store, with
    ``is_host=false`` on every node) and then, by default, has the node that became
    rank 0 start a second store for the ranks, which dies with that node. Here no node
    starts one: every node's ranks get the outside store (``TORCHELASTIC_USE_AGENT_STORE``
    stays set: they are its clients), so that the host of rank 0 can be lost and
    replaced while the others go on."""
    from torch.distributed.elastic.rendezvous import api, dynamic_rendezvous

    handler = getattr(dynamic_rendezvous, "DynamicRendezvousHandler", None)
    info_type = getattr(api, "RendezvousStoreInfo", None)
    if handler is None or info_type is None or not hasattr(info_type, "build"):
        print(  # the ranks then use rank 0's host's store: that host is not replaceable
            "dmlctl: this torch's elastic agent cannot hand its ranks the run's store at "
            f"{endpoint}; they use the store of rank 0's host",
            file=sys.stderr,
        )
        return
    os.environ.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)  # the ranks are its clients
    addr, port = endpoint.rsplit(":", 1)
    info = api.RendezvousStoreInfo(addr, int(port))

    class _Outside:  # what torchrun keeps of "its" store: the port only
        def __init__(self, port: int) -> None:
            self.port = port

    def build(*args: Any, **kwargs: Any) -> api.RendezvousStoreInfo:
        return info

    def no_server(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _Outside(int(port))

    info_type.build = staticmethod(build)
    handler._create_tcp_store_server = no_server


def wait_for_ranks_at_exit(
    timeout: float = EXIT_WAIT_S, reach: float = EXIT_CONNECT_S, linger: bool = True
) -> None:
    """Patch torchrun's exit barrier for a run that replaces lost ranks in place.

    torchrun waits at its end (up to 5 minutes) until every node's torchrun got there,
    so that the node serving the store outlives every rank that uses it. A node
    replaced in place never gets there: its ranks run under a stand-in
    (:mod:`dmlctl.agent.standin`). So each torchrun of such a run waits instead until
    every rank of the world — whichever process runs it now — said it is done with
    the store (:func:`dmlctl.runtime.rejoin.done`), at most ``timeout`` seconds; the
    store's own torchrun then stays :data:`EXIT_LINGER_S` more, and one that cannot
    reach the store within ``reach`` seconds (it has ended: every rank was done)
    ends at once instead of retrying for the store's 5-minute timeout. Without
    ``linger`` (the store is the controller's, which outlives every torchrun) nobody
    stays."""
    from datetime import timedelta

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    from dmlctl.runtime import rejoin

    def _exit_barrier(self: Any) -> None:
        group = self._worker_group
        try:
            within = timedelta(seconds=reach)
            store = rejoin.connect(group.master_addr, int(group.master_port), within)
        except Exception:  # the store's torchrun ended: every rank was done
            return
        try:
            world = int(group.workers[0].world_size)
            store.wait([rejoin.done_key(r) for r in range(world)], timedelta(seconds=timeout))
        except Exception as exc:  # the run's outcome is its ranks', not this wait's
            print(f"dmlctl: not every rank said it is done with the store: {exc}", file=sys.stderr)
            return
        if linger and int(group.group_rank) == 0 and int(group.group_world_size or 1) > 1:
            time.sleep(EXIT_LINGER_S)  # other nodes' torchruns may still come

    SimpleElasticAgent._exit_barrier = _exit_barrier  # type: ignore[method-assign]


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


if __name__ == "__main__":
    run(sys.argv[1:])
