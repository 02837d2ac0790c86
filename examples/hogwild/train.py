"""Hogwild: sparse logistic regression, every worker updating one shared weight vector.

    python train.py                                          # one process
    DMLCTL_STRATEGY=hogwild torchrun --standalone --nproc-per-node 2 train.py
    dmlctl launch job.yaml                                   # through dmlctl

Hogwild's setting: each sample has 10 active features out of 20,000, so one step
touches 10 rows of the weights and two workers rarely write the same row at the same
time. The labels come from a hidden weight vector plus noise. Every rank generates
the same data from a fixed seed; ctx.shard gives each rank its own part. The workers
share the parameters through memory and never communicate.
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
parser.add_argument("--batch-size", type=int, default=16, help="per worker")
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


class SparseLogistic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.EmbeddingBag(DIM, 1, mode="sum", sparse=True)  # sparse gradients
        self.bias = nn.Parameter(torch.zeros(1))
        nn.init.zeros_(self.weights.weight)

    def forward(self, active: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.weights(active).squeeze(1) + self.bias
        return logits


net = SparseLogistic()
model, optimizer = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=args.lr))

print(f"rank {ctx.rank}/{ctx.world_size}: {len(train_set) // ctx.world_size} training samples")
step = 0
for x, y in ctx.shard(train_set, batch_size=args.batch_size, epochs=args.epochs):
    logits = model(x)
    loss = F.binary_cross_entropy_with_logits(logits, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()  # updates only the 10 * batch rows this batch touched
    step += 1
    if step % 1000 == 0:
        acc = ((logits > 0).float() == y).float().mean()
        ctx.log(step=step, loss=loss, acc=acc, epoch=ctx.epoch)
    if step % 5000 == 0:
        print(f"step {step} epoch {ctx.epoch} loss {loss.item():.4f}")

# Each rank scores every world_size-th test point; all_reduce_mean averages the parts.
ctx.barrier()  # every worker's updates are in the shared weights
model.eval()
x, y = (t[ctx.rank :: ctx.world_size].to(ctx.device) for t in test_set.tensors)
with torch.no_grad():
    accuracy = ctx.all_reduce_mean(((model(x) > 0).float() == y).float().mean())
ctx.log(step=step, test_acc=accuracy)
if ctx.is_main:
    print(f"final accuracy: {accuracy:.2f}")
