"""Quickstart: an MLP classifies points drawn from overlapping Gaussian blobs.

    python train.py                                          # one process
    torchrun --standalone --nproc-per-node 2 train.py        # two processes, by hand
    dmlctl launch job.yaml                                   # through dmlctl

Every rank generates the same data from a fixed seed; ctx.shard gives each rank its
own part. Each of the 4 classes is a mixture of 3 blobs, so no straight line
separates them, and the blobs overlap a little: the best possible accuracy is below 1.
"""

# mypy: allow-untyped-calls
import argparse

import torch
import torch.nn.functional as F
from torch import nn

import dmlctl

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--batch-size", type=int, default=64, help="per worker")
args = parser.parse_args()

torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)

CLASSES, BLOBS, DIM = 4, 3, 8
gen = torch.Generator().manual_seed(42)
centers = 0.8 * torch.randn(CLASSES * BLOBS, DIM, generator=gen)  # blob i is class i % 4


def blobs(n: int) -> torch.utils.data.TensorDataset:
    blob = torch.randint(CLASSES * BLOBS, (n,), generator=gen)
    points = centers[blob] + 0.5 * torch.randn(n, DIM, generator=gen)
    return torch.utils.data.TensorDataset(points, blob % CLASSES)


train_set, test_set = blobs(16_000), blobs(4_000)

net = nn.Sequential(
    nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES)
)
model, optimizer = ctx.prepare(net, torch.optim.Adam(net.parameters(), lr=args.lr))

print(f"rank {ctx.rank}/{ctx.world_size}: {len(train_set) // ctx.world_size} training samples")
step = 0
for x, y in ctx.shard(train_set, batch_size=args.batch_size, epochs=args.epochs):
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    step += 1
    if step % 25 == 0:
        acc = (logits.argmax(dim=1) == y).float().mean()
        ctx.log(step=step, loss=loss, acc=acc, epoch=ctx.epoch)
    if step % 100 == 0:
        print(f"step {step} epoch {ctx.epoch} loss {loss.item():.4f}")

# Each rank scores every world_size-th test point; all_reduce_mean averages the parts.
model.eval()
x, y = (t[ctx.rank :: ctx.world_size].to(ctx.device) for t in test_set.tensors)
with torch.no_grad():
    accuracy = ctx.all_reduce_mean((model(x).argmax(dim=1) == y).float().mean())
ctx.log(step=step, test_acc=accuracy)
if ctx.is_main:
    print(f"final accuracy: {accuracy:.2f}")
