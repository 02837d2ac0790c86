"""A tiny regression with an absurd learning rate: its loss and parameters blow up.

``--log-every N`` logs the loss every N steps (0: never, so only the strategy's
parameter check can notice); the script itself never checks anything."""

import argparse

import torch

import dmlctl

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=1e6)
parser.add_argument("--log-every", type=int, default=1)
args = parser.parse_args()

ctx = dmlctl.init(seed=0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
model, optimizer = ctx.prepare(model, optimizer)
inputs = torch.randn(256, 4)
data = torch.utils.data.TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
for step, (x, y) in enumerate(ctx.shard(data, batch_size=8, epochs=4), start=1):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if args.log_every and step % args.log_every == 0:
        ctx.log(step=step, loss=loss)
print(f"rank {ctx.rank} finished training", flush=True)
