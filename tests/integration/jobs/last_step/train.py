"""A worker of an in-place run killed right after its last step (rank 1's first
process SIGKILLs itself after step ``--kill-at``): its replacement must join its
peers' final round and the store collectives after it, with no batch left to take
(``tests/integration/test_parameter_servers.py``)."""

import argparse
import os
import signal

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import dmlctl

parser = argparse.ArgumentParser()
parser.add_argument("--kill-at", type=int, required=True)
args = parser.parse_args()

ctx = dmlctl.init(seed=0)
g = torch.Generator().manual_seed(0)
x = torch.randn(256, 8, generator=g)
data = TensorDataset(x, (x.sum(dim=1) > 0).long())
net = torch.nn.Linear(8, 2)
model, optimizer = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
for step, (xb, yb) in enumerate(ctx.shard(data, batch_size=16, epochs=2), start=1):
    loss = F.cross_entropy(model(xb), yb)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    ctx.log(step=step, loss=loss)
    if ctx.rank == 1 and not os.environ.get("DMLCTL_REJOIN") and step == args.kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
with torch.no_grad():
    accuracy = ctx.all_reduce_mean((model(x).argmax(dim=1) == data.tensors[1]).float().mean())
print(f"rank {ctx.rank} done: accuracy {float(accuracy):.3f}")
