"""dmlctl's rendezvous backend, registered through torch's rendezvous registry.

Every host's torchrun (:mod:`dmlctl.agent.torchrun`) names the backend ``dmlctl``
(:data:`dmlctl.agent_config.RDZV_BACKEND`) with these ``--rdzv-conf`` keys:

* ``run``: the run's id. It is the ranks' ``TORCHELASTIC_RUN_ID`` in every attempt,
  while the rendezvous id (``--rdzv-id``) is new in each attempt.
* ``is_host``: as torch's c10d backend reads it.
* ``store=run``: the nodes meet at the run's store, which the controller serves at
  ``--rdzv-endpoint``, and the ranks use that store as ``MASTER_ADDR:MASTER_PORT``;
  ``node``: this host's node rank in the plan (without it, the order they come in).
  No torchrun then serves a store, so the host of rank 0 can be lost and replaced
  while the other hosts go on (``restart.mode: in_place``).

Without ``store=run`` the meeting is torch's own c10d rendezvous
(:class:`RunRendezvous` only names the run).
"""

from __future__ import annotations

from datetime import timedelta

from torch._C._distributed_c10d import PrefixStore, Store, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
    c10d_rendezvous_backend,
    dynamic_rendezvous,
    rendezvous_handler_registry,
)

from dmlctl.agent_config import RDZV_BACKEND

JOIN_TIMEOUT_S = 600
"""How long a node waits for the others at the run's store, as torch's c10d backend
waits by default (its ``join_timeout``)."""


class RunRendezvous(RendezvousHandler):
    """torch's c10d rendezvous, under the run's name: every call goes to ``inner``
    except :meth:`get_run_id`, which gives the run's id instead of the attempt's, and
    :meth:`get_backend`, which gives the backend's registered name."""

    def __init__(self, inner: RendezvousHandler, run_name: str) -> None:
        self._inner = inner
        self._run_name = run_name

    def get_backend(self) -> str:
        return RDZV_BACKEND  # the name it was registered under, as the registry checks

    @property
    def use_agent_store(self) -> bool:
        return self._inner.use_agent_store

    def next_rendezvous(self) -> RendezvousInfo:
        return self._inner.next_rendezvous()

    def is_closed(self) -> bool:
        return self._inner.is_closed()

    def set_closed(self) -> None:
        self._inner.set_closed()  # type: ignore[no-untyped-call]

    def num_nodes_waiting(self) -> int:
        return self._inner.num_nodes_waiting()

    def get_run_id(self) -> str:
        return self._run_name

    def shutdown(self) -> bool:
        return self._inner.shutdown()


class RunStoreRendezvous(RendezvousHandler):
    """The nodes of one attempt meet at the run's store, and the ranks get that store.

    Each node is the node rank the plan gave it (``node``), or takes the next one from
    a counter kept under the attempt's rendezvous id, then waits until every node has
    come. The world is fixed for the attempt: the controller plans it, and a changed
    world is a new attempt."""

    def __init__(self, params: RendezvousParameters, run_name: str) -> None:
        host, _, port = params.endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"the run's store needs HOST:PORT, not {params.endpoint!r}")
        self._host, self._port = host, int(port)
        self._attempt = params.run_id
        self._run_name = run_name or params.run_id
        self._nodes = int(params.max_nodes)
        node = params.get("node")
        self._node = int(node) if node is not None and str(node).isdigit() else None
        self._timeout = timedelta(seconds=params.get_as_int("join_timeout") or JOIN_TIMEOUT_S)
        self._closed = False

    def get_backend(self) -> str:
        return RDZV_BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True  # the ranks are clients of the run's store

    def next_rendezvous(self) -> RendezvousInfo:
        if self._closed:
            raise RendezvousClosedError()
        store = self._meeting_store()
        rank = self._node if self._node is not None else int(store.add("joined", 1)) - 1
        if rank >= self._nodes:
            raise RendezvousClosedError(
                f"attempt {self._attempt}: node {rank + 1} came to a meeting of {self._nodes}"
            )
        store.set(f"node/{rank}", "1")
        try:
            store.wait([f"node/{r}" for r in range(self._nodes)], self._timeout)
        except RuntimeError as exc:  # torch raises a plain error on a store timeout
            raise RendezvousTimeoutError(
                f"attempt {self._attempt}: not every node came to the run's store at "
                f"{self._host}:{self._port} within {self._timeout.total_seconds():g} s"
            ) from exc
        bootstrap = RendezvousStoreInfo(self._host, self._port)
        return RendezvousInfo(store, rank, self._nodes, bootstrap)

    def _meeting_store(self) -> Store:
        """A client of the run's store, its keys under this attempt's rendezvous id."""
        client = TCPStore(self._host, self._port, is_master=False, timeout=self._timeout)
        return PrefixStore(f"dmlctl.rendezvous.{self._attempt}", client)

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        return 0  # the world never grows within an attempt

    def get_run_id(self) -> str:
        return self._run_name

    def shutdown(self) -> bool:
        self._closed = True
        return True


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler ``params`` asks for (see the module)."""
    run_name = str(params.get("run", "") or params.run_id)
    if params.get("store") == "run":
        return RunStoreRendezvous(params, run_name)
    backend, store = c10d_rendezvous_backend.create_backend(params)
    inner = dynamic_rendezvous.create_handler(store, backend, params)
    return RunRendezvous(inner, run_name)


def register() -> None:
    """Register the backend with torch's rendezvous registry (again: nothing changes)."""
    rendezvous_handler_registry.register(RDZV_BACKEND, create_handler)
