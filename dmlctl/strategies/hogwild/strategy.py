"""Hogwild!: lock-free SGD on parameters shared in memory (Recht et al., NeurIPS 2011).

Every worker of the run lives on one host. :func:`prepare` puts the model's
parameters into **one shared-memory tensor** that every worker maps, and each
worker's optimizer then updates that memory in place, without locks and without any
communication: ``x ← x − η gᵢ`` applied concurrently by all workers to the same
``x``. Updates may overwrite each other; the paper shows this costs little when each
step touches few coordinates (sparse gradients, e.g. ``nn.EmbeddingBag(sparse=True)``
with ``torch.optim.SGD``, which updates only the rows a batch touched).

Promises:

* **One host only.** :func:`~dmlctl.strategies.hogwild.params.check_hosts` rejects a
  plan over more than one host before anything starts; :func:`prepare` raises ``RuntimeError`` when
  ``ctx.local_world_size != ctx.world_size``. At world size 1 the model and the
  optimizer come back unchanged.
* **Same start, same memory.** Rank 0's parameters are the start; afterwards every
  ``Parameter`` object is unchanged (so an optimizer built on ``model.parameters()``
  before :func:`prepare` keeps working) but its ``.data`` is a view into the shared
  tensor. All parameters must be on the CPU and share one dtype (``RuntimeError``
  otherwise). Buffers (e.g. BatchNorm statistics) stay local to each rank.
* **No communication.** Gradients and parameters are never sent: the returned
  optimizer reports ``comm_bytes_per_step = 0``. Its state (momentum, Adam moments)
  is local to each rank; only the parameters are shared.
* **Data.** Each rank iterates over its own part of the data (``ctx.shard``).
* **The shared file.** ``/dev/shm/dmlctl-hogwild-<run id>[-a<attempt>]`` (the run id
  from ``DMLCTL_RUN_ID``, else ``MASTER_ADDR``/``MASTER_PORT``; the temporary
  directory where ``/dev/shm`` does not exist). Rank 0 creates it (``RuntimeError``
  when the directory lacks room for the parameters), every rank maps it, and every
  rank unlinks it as soon as all have mapped it (a mapping outlives its name), still
  inside :func:`prepare`; so a crash afterwards leaves nothing behind, and the
  memory is freed when the last worker exits.

:class:`~dmlctl.strategies.hogwild.params.Params` and
:func:`~dmlctl.strategies.hogwild.params.check_hosts` are in
:mod:`dmlctl.strategies.hogwild.params` (torch-free); this module imports torch (hosts
only).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from pydantic import BaseModel

from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.strategies.hogwild.params import Params
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context

_SHM_DIR = Path("/dev/shm")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class HogwildOptimizer(StrategyOptimizer):
    """The user's optimizer, stepping on shared parameters; never communicates."""

    def communicate(self) -> None:
        """Nothing to send: the parameters are shared memory."""

    def final_model(self) -> None:
        """Wait until every worker stopped writing (a barrier): from then on every
        worker reads the same final parameters."""
        dist.barrier()

    def shown_settings(self) -> dict[str, object]:
        """Nothing: hogwild has no period."""
        return {}


def shm_path() -> Path:
    """The shared file of this run and attempt (see the module docstring)."""
    run_id = os.environ.get("DMLCTL_RUN_ID")
    if not run_id:
        addr = os.environ.get("MASTER_ADDR", "local")
        run_id = f"{addr}-{os.environ.get('MASTER_PORT', '0')}"
    name = f"dmlctl-hogwild-{run_id}"
    attempt = os.environ.get("DMLCTL_ATTEMPT")
    if attempt:
        name += f"-a{attempt}"
    directory = _SHM_DIR if _SHM_DIR.is_dir() else Path(tempfile.gettempdir())
    return directory / _UNSAFE.sub("_", name)


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Make the parameters views into rank 0's shared tensor; wrap ``optimizer`` so
    it reports ``comm_bytes_per_step = 0``. Collective (two barriers).

    Promises: see the module docstring. ``optimizer`` must be built on the model's
    parameters; the model comes back unchanged (same object, not wrapped).
    """
    params_as(Params, params)
    if ctx.world_size == 1:
        return model, optimizer
    weights = share_model(ctx, model, "hogwild")
    return model, HogwildOptimizer(optimizer, weights, world_size=ctx.world_size)


def share_model(ctx: Context, model: torch.nn.Module, strategy: str) -> list[torch.nn.Parameter]:
    """The model's parameters, each made a view into the run's shared tensor filled
    from rank 0's (:func:`share_parameters`; collective). Raises RuntimeError naming
    ``strategy`` when the workers do not all run on this host."""
    if ctx.local_world_size != ctx.world_size:
        raise RuntimeError(
            f"{strategy}: the {ctx.world_size} workers must all run on one host "
            f"(this host runs {ctx.local_world_size}): parameters are shared through memory"
        )
    weights = list(model.parameters())
    if weights:
        share_parameters(ctx, weights)
    return weights


def share_parameters(ctx: Context, weights: list[torch.nn.Parameter]) -> None:
    """Point every parameter's ``.data`` at its slice of the run's shared tensor,
    filled from rank 0's parameters. Collective; the file is gone when it returns."""
    dtypes = {p.dtype for p in weights}
    devices = {p.device.type for p in weights}
    if len(dtypes) > 1:
        raise RuntimeError(
            f"hogwild: parameters must share one dtype, got {sorted(map(str, dtypes))}"
        )
    if devices != {"cpu"}:
        raise RuntimeError(
            f"hogwild: parameters must be on the CPU (shared through host memory), "
            f"got {sorted(devices)}"
        )
    dtype = weights[0].dtype
    numel = sum(p.numel() for p in weights)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    path = shm_path()

    def unlink() -> None:
        path.unlink(missing_ok=True)

    try:
        if ctx.rank == 0:
            unlink()  # a stale file of the same name: a crashed earlier run
            _check_room(path.parent, nbytes)
            flat = _map(path, numel, dtype)
            flat.copy_(torch.cat([p.detach().reshape(-1) for p in weights]))
        dist.barrier()
        if ctx.rank != 0:
            # torch.from_file creates (or extends) a missing (or short) file: check first
            size = path.stat().st_size if path.exists() else -1
            if size != nbytes:
                raise RuntimeError(
                    f"hogwild: shared parameter file {path} has {size} bytes "
                    f"after rank 0 wrote it, expected {nbytes}"
                )
            flat = _map(path, numel, dtype)
        offset = 0
        for p in weights:
            n = p.numel()
            p.data = flat[offset : offset + n].view_as(p)
            offset += n
        dist.barrier()  # every rank has mapped the file: its name is no longer needed
    finally:
        # Here rather than in ctx.on_close: it also runs when a barrier fails, and the
        # name is gone before training starts, so a later crash leaves no file behind.
        # Every rank removes it (missing_ok), so it is gone when prepare returns on any.
        unlink()


def _check_room(directory: Path, nbytes: int) -> None:
    """``RuntimeError`` when ``directory`` cannot hold ``nbytes``: writing past a full
    tmpfs kills the process with SIGBUS instead of raising (Docker's default
    ``/dev/shm`` is 64 MiB)."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    if free < nbytes:
        raise RuntimeError(
            f"hogwild: the parameters need {nbytes / 2**20:.1f} MiB of shared memory but "
            f"{directory} has {free / 2**20:.1f} MiB free (in Docker: raise --shm-size)"
        )


def _map(path: Path, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """``numel`` elements of ``path`` mapped shared (the file is created or extended
    to that size when shorter, so only rank 0 may call this on a missing file)."""
    return torch.from_file(str(path), shared=True, size=numel, dtype=dtype)
