"""A short local-sgd training whose rank 0 then "evaluates" (writes the file
``$MARK``, sleeps ``$EVAL_S`` seconds on the first attempt, then prints ``rank 0
evaluated``) while the other workers have ended: a host lost then is lost after the
run's last collectives. ``CLOSE_FIRST=1``: rank 0 ends its part first
(``ctx.close()``), as a script whose last lines do no more with the run."""

import os
import time

import torch

import dmlctl

ctx = dmlctl.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
model, opt = ctx.prepare(model, opt)
data = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
for x, y in ctx.shard(data, batch_size=8, epochs=2):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    ctx.log(loss=loss)
if ctx.rank == 0:
    if os.environ.get("CLOSE_FIRST") == "1":
        ctx.close()
    with open(os.environ["MARK"], "w") as f:
        f.write("trained\n")
    if os.environ.get("DMLCTL_ATTEMPT", "1") == "1":
        time.sleep(float(os.environ.get("EVAL_S", "12")))
    print("rank 0 evaluated")
