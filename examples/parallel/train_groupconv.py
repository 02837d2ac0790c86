"""Train the group-convolution CNN (``groupconv.py``) on scikit-learn's digits, split
over the tensor-parallel ranks of each replica, the replicas in data parallel.

    python train_groupconv.py            # one process, the whole network
    dmlctl launch groupconv.yaml         # 2 replicas × 2 tensor-parallel ranks

Prints the test accuracy at the end.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from groupconv import network

import dmlctl
from dmlctl.bench.accuracy_job.digits import data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32, help="per data-parallel replica")
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ctx = dmlctl.init(seed=0)
    train, (x_test, y_test) = data()
    model: torch.nn.Module = network()
    opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    model, opt = ctx.prepare(model, opt)
    batches = ctx.shard(train, batch_size=args.batch_size, epochs=args.epochs)
    for step, (x, y) in enumerate(batches, start=1):
        loss = ctx.train_step(model, x, y, F.cross_entropy)
        opt.step()
        opt.zero_grad()
        ctx.log(step=step, loss=loss)
    with torch.no_grad():  # every rank of a replica takes part: the forward exchanges
        predicted = model(x_test.to(ctx.device)).argmax(1).cpu()
    accuracy = float((predicted == y_test).float().mean())
    if ctx.is_main:
        ctx.log(test_acc=accuracy)
        print(f"test accuracy {accuracy:.4f} after {args.epochs} epochs", flush=True)


if __name__ == "__main__":
    main()
