# mypy: allow-untyped-calls
"""What the bench's two job scripts (``digits.py``, ``lm.py``) share: the parameter
digest every row compares between workers, and the command line they run under
dmlctl (its options, its one result record and line)."""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

Train = Callable[[Any, str, int, int, int], dict[str, Any]]
"""``train(ctx, optimizer, epochs, batch, seed)`` → the run's results by name."""


def digest(net: nn.Module) -> str:
    """A hash of the model's parameters (equal on two ranks iff they are identical;
    under tensor parallelism, of the parts this rank holds)."""
    local = [getattr(p, "_local_tensor", p) for p in net.parameters()]  # a DTensor's shard
    flat = torch.cat([t.detach().reshape(-1).cpu() for t in local])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]


def run_script(
    doc: str,
    train: Train,
    optimizers: Sequence[str],
    *,
    epochs: int,
    batch: int,
    batch_help: str,
    metric: str,
) -> None:
    """Parse ``--optimizer`` (the first of ``optimizers`` by default), ``--epochs``,
    ``--batch`` and ``--seed``; train on one thread with the job's strategy; on rank 0
    log ``metric`` and print ``metric=value``."""
    import dmlctl

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--optimizer", choices=optimizers, default=optimizers[0])
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--batch", type=int, default=batch, help=batch_help)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ctx = dmlctl.init(seed=args.seed)
    result = train(ctx, args.optimizer, args.epochs, args.batch, args.seed)
    if ctx.is_main:
        ctx.log(**{metric: result[metric]})
        print(f"{metric}={result[metric]:.4f}", flush=True)
