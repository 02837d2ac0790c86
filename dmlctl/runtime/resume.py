"""What a checkpoint holds for one rank, and putting it back.

* :func:`training_state` / :func:`restore_training_state` — the model (unwrapped from
  DDP), the optimizer (with a StrategyOptimizer's strategy state), then
  :func:`rank_state`;
* :func:`rank_state` / :func:`restore_rank_state` — what every layout saves alike (a
  sharded checkpoint's own per-rank file too): the model's own ``strategy_state()``
  (e.g. PowerSGD's error feedback), the RNG states, the data position and the user's
  extras;
* :func:`capture_rng` / :func:`restore_rng` — torch (CPU + this rank's GPU), ``random``
  and numpy generators, as values that load with ``weights_only=True``.

Writing and reading them atomically is :mod:`dmlctl.runtime.checkpoint`'s job.
"""

from __future__ import annotations

import random
from typing import Any

import torch


def capture_rng() -> dict[str, Any]:
    """torch (CPU + CUDA), ``random`` and numpy generator states, as tensors/tuples
    that load with ``weights_only=True``."""
    out: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        out["cuda"] = torch.cuda.get_rng_state()  # this rank's own GPU's
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is optional
        return out
    _, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    out["numpy"] = (
        torch.from_numpy(np.asarray(keys, np.int64)),
        int(pos),
        int(has_gauss),
        float(gauss),
    )
    return out


def restore_rng(state: dict[str, Any]) -> None:
    """Undo :func:`capture_rng` (states missing from ``state`` are left alone)."""
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "python" in state:
        random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        _restore_cuda_rng(state["cuda"])
    if "numpy" in state:
        import numpy as np

        keys, *rest = state["numpy"]
        np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), *rest))


def _restore_cuda_rng(saved: Any) -> None:
    """This rank's GPU generator ← ``saved``: the state of the GPU the checkpoint's
    rank used (resumed onto whichever GPU this rank has now). A checkpoint of an
    older dmlctl holds every GPU's state (a list): this rank's index there, or the
    first."""
    if isinstance(saved, (list, tuple)):
        if not saved:
            return
        index = torch.cuda.current_device()
        saved = saved[index] if index < len(saved) else saved[0]
    torch.cuda.set_rng_state(saved)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "module", None)  # DDP and similar wrappers
    return inner if isinstance(inner, torch.nn.Module) else model


def rank_state(
    model: torch.nn.Module, *, epoch: int, batches: int, extra: dict[str, Any]
) -> dict[str, Any]:
    """What every rank's checkpoint holds whatever its layout: the model's
    ``strategy_state()``, RNG states, the data position (epoch, batches consumed in
    it) and ``extra``; :func:`restore_rank_state` puts it back."""
    strategy = getattr(model, "strategy_state", None)
    return {
        "strategy": strategy() if callable(strategy) else {},
        "rng": capture_rng(),
        "data": {"epoch": epoch, "batches": batches},
        "extra": dict(extra),
    }


def restore_rank_state(state: dict[str, Any], model: torch.nn.Module) -> None:
    """Load what :func:`rank_state` captured: the model's strategy state (through its
    ``load_strategy_state``, when it has one) and the RNG states (the data position
    and ``extra`` are the caller's)."""
    load_strategy = getattr(model, "load_strategy_state", None)
    if callable(load_strategy):
        load_strategy(state.get("strategy", {}))
    restore_rng(state.get("rng", {}))


def training_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    epoch: int,
    batches: int,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """What ``Context.checkpoint`` saves per rank: model (unwrapped), optimizer (with a
    StrategyOptimizer's strategy state), then :func:`rank_state` (the model's
    ``strategy_state()``, RNG states, the data position and ``extra``)."""
    return {
        "model": _unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        **rank_state(model, epoch=epoch, batches=batches, extra=extra),
    }


def restore_training_state(
    state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Load what :func:`training_state` captured back into the live objects."""
    _unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    restore_rank_state(state, model)
