# mypy: allow-untyped-calls
"""A small CNN on scikit-learn's digits: the workload of ``dmlctl bench accuracy`` and
of the accuracy table in the test suite (``tests/strategies/test_accuracy.py``).

Data: the 1,797 8×8 images that ship with scikit-learn (no download), scaled to
[0, 1], split 80/20 stratified with a fixed seed: 1,437 training and 360 test images
(one test image is 0.28 points of accuracy). Training: ``epochs`` passes of
``ctx.shard`` with ``batch`` images per worker (as a script is written: with N
workers an epoch takes 1/N of the steps), SGD with momentum 0.9 (lr 0.02) or Adam
(lr 3e-3), the strategy's defaults. The test accuracy
is measured on the model each rank holds at the end (after the strategy's final
model).

Run by dmlctl (``dmlctl launch`` of a job whose script is this file) it logs
``loss`` every 10 steps and, on rank 0, ``test_acc`` at the end, and prints
``test_acc=0.9833``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dmlctl.bench.accuracy_job.common import digest, run_script

OPTIMIZERS = ("momentum", "adam")
EPOCHS = 20
BATCH = 32  # per worker


def data() -> tuple[torch.utils.data.TensorDataset, tuple[torch.Tensor, torch.Tensor]]:
    """The training set and the test tensors (stratified 80/20 split, seed 0)."""
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]
    from sklearn.model_selection import train_test_split  # type: ignore[import-untyped]

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
    return torch.utils.data.TensorDataset(x_tr, y_tr), (x_te, y_te)


def model(seed: int) -> nn.Module:
    """Two 3×3 convolutions, a max-pool and two linear layers (≈ 38k parameters)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    """``momentum``: SGD lr 0.02 momentum 0.9; ``adam``: Adam lr 3e-3."""
    if name == "momentum":
        return torch.optim.SGD(params, lr=0.02, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=3e-3)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


def train(
    ctx: Any, opt_name: str, epochs: int = EPOCHS, batch: int = BATCH, seed: int = 0
) -> dict[str, Any]:
    """Train with the job's strategy; this rank's test accuracy, parameter digest and
    final loss (module docstring)."""
    train_set, (x_te, y_te) = data()
    net = model(seed)
    net, opt = ctx.prepare(net, optimizer(opt_name, net.parameters()))
    loss = torch.zeros(())
    batches = ctx.shard(train_set, batch_size=batch, epochs=epochs, seed=seed)
    for step, (x, y) in enumerate(batches, start=1):
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            ctx.log(loss=loss)
    with torch.no_grad():
        logits = net(x_te.to(ctx.device))
        acc = float((logits.argmax(1).cpu() == y_te).float().mean().item())
    return {"test_acc": acc, "digest": digest(net), "loss": float(loss.item())}


def main() -> None:
    run_script(
        __doc__ or "",
        train,
        OPTIMIZERS,
        epochs=EPOCHS,
        batch=BATCH,
        batch_help="images per worker",
        metric="test_acc",
    )


if __name__ == "__main__":
    main()
