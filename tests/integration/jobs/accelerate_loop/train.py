"""A tiny accelerate loop, as a user writes one: accelerator.log with dmlctl's tracker."""

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dmlctl.integrations.accelerate import DmlctlTracker

accelerator = Accelerator(cpu=True, log_with=[DmlctlTracker()])
accelerator.init_trackers("tiny")
torch.manual_seed(0)
x = torch.randn(256, 8)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
model, opt, data = accelerator.prepare(model, opt, data)
step = 0
for epoch in range(2):
    for xb, yb in data:
        loss = nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        step += 1
        accelerator.log({"loss": loss.item(), "lr": 0.05, "epoch": epoch}, step=step)
accelerator.end_training()
