"""Trains 20 steps with checkpoints every 5. With FAULT=1, rank 1 is killed (SIGKILL)
at step 12 on the first attempt; the restart resumes from step 10. Rank 0 writes the
final weights to $OUT. STEP_SLEEP slows every step (to kill a controller mid-run)."""

import os
import signal
import time

import torch
import torch.nn.functional as F

import dmlctl

torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)
gen = torch.Generator().manual_seed(7)
x, y = torch.randn(512, 8, generator=gen), torch.randint(0, 3, (512,), generator=gen)
data = torch.utils.data.TensorDataset(x, y)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
model, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
step = ctx.resume(model, opt)
attempt = int(os.environ.get("DMLCTL_ATTEMPT", "1"))
print(f"rank {ctx.rank} attempt {attempt} starts at step {step}", flush=True)
for xb, yb in ctx.shard(data, batch_size=16, epochs=2):
    if step == 20:
        break
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    ctx.log(step=step, loss=loss)
    ctx.checkpoint(step, model, opt)
    time.sleep(float(os.environ.get("STEP_SLEEP", "0")))
    if os.environ.get("FAULT") == "1" and attempt == 1 and ctx.rank == 1 and step == 12:
        os.kill(os.getpid(), signal.SIGKILL)
if ctx.rank == 0:
    torch.save({k: v.detach().clone() for k, v in net.state_dict().items()}, os.environ["OUT"])
