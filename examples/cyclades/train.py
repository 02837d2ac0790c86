"""Cyclades: sparse logistic regression on weights shared in memory, in conflict-free
rounds.

    python train.py                                          # one process
    DMLCTL_STRATEGY=cyclades torchrun --standalone --nproc-per-node 2 train.py
    dmlctl launch job.yaml                                   # through dmlctl

Each sample has 10 active features out of 20,000; its update touches those 10
weights. Under cyclades ``ctx.shard`` hands every worker, round by round, whole
groups of samples that share no feature with another worker's (the field that holds
a sample's features is ``strategy.params.coordinates``, here field 0, ``active``), so
the run equals one process applying the same updates in order. What that needs: a
model whose gradients are sparse (``nn.EmbeddingBag(sparse=True)``, no dense bias)
and plain SGD (momentum or weight decay would touch every weight).
"""

# mypy: allow-untyped-calls
import argparse

import torch
import torch.nn.functional as F
from torch import nn

import dmlctl

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.5)
parser.add_argument("--batch-size", type=int, default=4, help="updates per optimizer step")
args = parser.parse_args()

torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)

DIM, ACTIVE = 20_000, 10
gen = torch.Generator().manual_seed(42)
hidden = torch.randn(DIM, generator=gen)


def samples(n: int) -> torch.utils.data.TensorDataset:
    active = torch.randint(DIM, (n, ACTIVE), generator=gen)  # indices of the 1-features
    score = hidden[active].sum(dim=1) + 0.5 * torch.randn(n, generator=gen)
    return torch.utils.data.TensorDataset(active, (score > 0).float())


train_set, test_set = samples(200_000), samples(10_000)
net = nn.EmbeddingBag(DIM, 1, mode="sum", sparse=True)  # sparse gradients, no bias
nn.init.zeros_(net.weight)
model, optimizer = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=args.lr))

step = 0
for x, y in ctx.shard(train_set, batch_size=args.batch_size, epochs=args.epochs):
    logits = model(x).squeeze(1)
    loss = F.binary_cross_entropy_with_logits(logits, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()  # touches only the rows of this batch's features
    step += 1
    if step % 2000 == 0:
        ctx.log(step=step, loss=loss, epoch=ctx.epoch)

# The end of ctx.shard waited for every worker's updates: every rank reads the same
# weights. Each rank scores every world_size-th test point; all_reduce_mean averages.
x, y = (t[ctx.rank :: ctx.world_size].to(ctx.device) for t in test_set.tensors)
with torch.no_grad():
    accuracy = ctx.all_reduce_mean(((model(x).squeeze(1) > 0).float() == y).float().mean())
ctx.log(step=step, test_acc=accuracy)
if ctx.is_main:
    print(f"final accuracy: {accuracy:.4f}")
