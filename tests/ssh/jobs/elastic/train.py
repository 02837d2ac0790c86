"""40 steps of a tiny model, 0.1 s each, a checkpoint every 5 steps, resuming from
the newest one. Prints where each attempt starts; rank 0 writes the final loss to
$OUT. Used to lose a host mid-run."""

import os
import time

import torch
import torch.nn.functional as F

import dmlctl

torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)
gen = torch.Generator().manual_seed(3)
x, y = torch.randn(1024, 8, generator=gen), torch.randint(0, 2, (1024,), generator=gen)
net = torch.nn.Linear(8, 2)
model, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
step = ctx.resume(model, opt)
attempt = os.environ.get("DMLCTL_ATTEMPT", "1")
print(f"rank {ctx.rank} of {ctx.world_size} attempt {attempt} starts at step {step}", flush=True)
loss = torch.zeros(())
for xb, yb in ctx.shard(torch.utils.data.TensorDataset(x, y), batch_size=8, epochs=50):
    if step == 40:
        break
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    ctx.log(step=step, loss=loss)
    ctx.checkpoint(step, model, opt)
    slow = os.environ.get(f"STEP_S_ATTEMPT_{attempt}") if step > 5 else None  # after a save
    time.sleep(float(slow or "0.1"))
if ctx.rank == 0:
    with open(os.environ["OUT"], "w") as f:
        f.write(f"{step} {loss.item()}\n")
