"""A communication-bound job for ``dmlctl bench advise``: an MLP of 2.2 million
parameters (8.8 MB of float32 gradients per step) on 64-dimensional Gaussian blobs.

    python train.py                               # one process
    dmlctl bench advise job.yaml --target 'test_acc>=0.9' --lab 100mbit

Every 10 steps rank 0 scores the model it holds on 1,000 held-out points and logs
``test_acc``, so the advisor sees when each strategy gets there. SGD with momentum.
"""

# mypy: allow-untyped-calls
import argparse

import torch
import torch.nn.functional as F
from torch import nn

import dmlctl

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.02)
parser.add_argument("--batch-size", type=int, default=32, help="per worker")
args = parser.parse_args()

torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)
CLASSES, BLOBS, DIM, WIDTH = 8, 4, 64, 1024
gen = torch.Generator().manual_seed(42)
centers = torch.randn(CLASSES * BLOBS, DIM, generator=gen)


def blobs(n: int) -> torch.utils.data.TensorDataset:
    blob = torch.randint(CLASSES * BLOBS, (n,), generator=gen)
    points = centers[blob] + 1.2 * torch.randn(n, DIM, generator=gen)
    return torch.utils.data.TensorDataset(points, blob % CLASSES)


train_set, test_set = blobs(40_000), blobs(1_000)
net = nn.Sequential(
    nn.Linear(DIM, WIDTH),
    nn.ReLU(),
    nn.Linear(WIDTH, WIDTH),
    nn.ReLU(),
    nn.Linear(WIDTH, WIDTH),
    nn.ReLU(),
    nn.Linear(WIDTH, CLASSES),
)
if ctx.is_main:
    print(f"{sum(p.numel() for p in net.parameters()):,} parameters")
optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
model, optimizer = ctx.prepare(net, optimizer)


def test_accuracy() -> float:
    with torch.no_grad():
        x, y = test_set.tensors
        return (net(x).argmax(dim=1) == y).float().mean().item()


for step, (x, y) in enumerate(
    ctx.shard(train_set, batch_size=args.batch_size, epochs=args.epochs), 1
):
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 10 == 0 and ctx.is_main:
        ctx.log(step=step, loss=loss, test_acc=test_accuracy())
if ctx.is_main:
    print(f"final test accuracy {test_accuracy():.3f}")
