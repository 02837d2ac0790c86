# mypy: allow-untyped-calls
"""Training script of ``dmlctl bench sparse``: sparse logistic regression, the same
script under ``hogwild`` and ``cyclades`` (one host, parameters in shared memory).

Data made here from a fixed seed: ``--samples`` samples with ``--active`` of
``--features`` binary features each, labels from a hidden weight vector plus noise.
Model: ``nn.EmbeddingBag(sparse=True)`` without a bias (a dense bias would be one
coordinate every update touches), plain SGD — so every update touches only its
sample's rows, as both algorithms assume.

Timing: from a barrier before the loop to the end of ``ctx.shard`` (whose last
barrier waits for every worker's updates). One record from the first worker at the
end: ``bench="sparse"``, ``samples_per_s`` (every sample of every epoch over that
time), ``train_loss`` (the whole training set, final model) and ``test_acc``.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import dmlctl

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--features", type=int, default=20_000)
parser.add_argument("--active", type=int, default=10, help="Active features per sample.")
parser.add_argument("--samples", type=int, default=100_000)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.5)
parser.add_argument("--batch-size", type=int, default=4, help="Updates per optimizer step.")
args = parser.parse_args()

torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)
gen = torch.Generator().manual_seed(42)
hidden = torch.randn(args.features, generator=gen)


def samples(n: int) -> torch.utils.data.TensorDataset:
    active = torch.randint(args.features, (n, args.active), generator=gen)
    score = hidden[active].sum(dim=1) + 0.5 * torch.randn(n, generator=gen)
    return torch.utils.data.TensorDataset(active, (score > 0).float())


train_set, test_set = samples(args.samples), samples(10_000)
net = nn.EmbeddingBag(args.features, 1, mode="sum", sparse=True)
nn.init.zeros_(net.weight)
model, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=args.lr))

ctx.barrier()
start = time.perf_counter()
for x, y in ctx.shard(train_set, batch_size=args.batch_size, epochs=args.epochs):
    loss = F.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
elapsed = time.perf_counter() - start

if ctx.is_main:
    with torch.no_grad():
        x, y = train_set.tensors
        train_loss = F.binary_cross_entropy_with_logits(net(x).squeeze(1), y)
        tx, ty = test_set.tensors
        test_acc = ((net(tx).squeeze(1) > 0).float() == ty).float().mean()
    ctx.log(
        bench="sparse",
        samples_per_s=args.samples * args.epochs / elapsed,
        train_loss=train_loss,
        test_acc=test_acc,
    )
    print(
        f"{elapsed:.2f} s, train loss {float(train_loss):.4f}, test accuracy {float(test_acc):.4f}"
    )
