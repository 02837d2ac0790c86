"""The quickstart's problem (an MLP on overlapping Gaussian blobs) for the
parameter-server strategies: the same script runs under ssgd, asgd, ssp, adadelay,
easgd-async, sync-ps and aadmm — only the job file differs.

    python train.py                               # one process: the baseline
    dmlctl launch asgd.yaml                       # 2 workers + 1 parameter server

Plain SGD with momentum (AdaDelay's servers make the step themselves, so an adaptive
optimizer would be ignored there). At the end every rank scores its part of the test
set; ``test_loss`` and ``test_acc`` are averaged over the workers and logged. With a
``checkpoint:`` block in the job the run saves and resumes (servers' state included).
"""

# mypy: allow-untyped-calls
import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import dmlctl

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--batch-size", type=int, default=32, help="per worker")
parser.add_argument(
    "--step-sleep",
    type=float,
    default=0.0,
    help="seconds every worker sleeps per step (simulated compute, for the straggler benchmark)",
)
parser.add_argument(
    "--straggler-factor",
    type=float,
    default=1.0,
    help="the last worker sleeps this many times --step-sleep (3: a 3x straggler)",
)
args = parser.parse_args()

torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)

CLASSES, BLOBS, DIM = 4, 3, 8
gen = torch.Generator().manual_seed(42)
centers = 0.8 * torch.randn(CLASSES * BLOBS, DIM, generator=gen)


def blobs(n: int) -> torch.utils.data.TensorDataset:
    blob = torch.randint(CLASSES * BLOBS, (n,), generator=gen)
    points = centers[blob] + 0.5 * torch.randn(n, DIM, generator=gen)
    return torch.utils.data.TensorDataset(points, blob % CLASSES)


train_set, test_set = blobs(16_000), blobs(4_000)
net = nn.Sequential(
    nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES)
)
optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
model, optimizer = ctx.prepare(net, optimizer)
last = ctx.rank == ctx.world_size - 1
pause = args.step_sleep * (args.straggler_factor if last else 1.0)

step = ctx.resume(model, optimizer)  # 0 without a checkpoint
if step:
    print(f"resumes at step {step}")  # the log says which rank (its global rank)
for x, y in ctx.shard(train_set, batch_size=args.batch_size, epochs=args.epochs):
    if pause:
        time.sleep(pause)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    step += 1
    if step % 50 == 0:
        ctx.log(step=step, loss=loss, epoch=ctx.epoch)
    ctx.checkpoint(step, model, optimizer)

model.eval()
x, y = (t[ctx.rank :: ctx.world_size].to(ctx.device) for t in test_set.tensors)
with torch.no_grad():
    logits = model(x)
    test_loss = ctx.all_reduce_mean(F.cross_entropy(logits, y))
    test_acc = ctx.all_reduce_mean((logits.argmax(dim=1) == y).float().mean())
ctx.log(step=step, test_loss=test_loss, test_acc=test_acc)
if ctx.is_main:
    print(f"final test loss {test_loss:.4f} accuracy {test_acc:.3f}")
