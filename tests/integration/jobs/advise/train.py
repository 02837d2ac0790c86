"""A small real job for ``dmlctl bench advise``: an MLP on Gaussian blobs, rank 0
logs ``test_acc`` on held-out points every 40 steps. It does not support ``bmuf``
(it says so and exits 1), as a user's script may not support every strategy."""

# mypy: allow-untyped-calls
import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn

import dmlctl

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()
if os.environ.get("DMLCTL_STRATEGY") == "bmuf":
    raise SystemExit("this script does not support bmuf")

torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)
gen = torch.Generator().manual_seed(42)
centers = torch.randn(8, 8, generator=gen)


def blobs(n: int) -> torch.utils.data.TensorDataset:
    blob = torch.randint(8, (n,), generator=gen)
    return torch.utils.data.TensorDataset(
        centers[blob] + 0.4 * torch.randn(n, 8, generator=gen), blob % 4
    )


train_set, test_set = blobs(8_000), blobs(1_000)
net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
model, optimizer = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9))
for step, (x, y) in enumerate(ctx.shard(train_set, batch_size=32, epochs=args.epochs), 1):
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 40 == 0 and ctx.is_main:
        with torch.no_grad():
            acc = (net(test_set.tensors[0]).argmax(dim=1) == test_set.tensors[1]).float().mean()
        ctx.log(step=step, loss=loss, test_acc=acc)
