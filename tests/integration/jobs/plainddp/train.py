"""A plain torchrun DDP script: never imports dmlctl, builds its own DDP."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

print("script starts", flush=True)
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for _ in range(5):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"rank {dist.get_rank()} trained", flush=True)
dist.destroy_process_group()
