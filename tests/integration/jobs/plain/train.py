"""A plain torchrun-style script: never imports dmlctl."""

import os

import torch
import torch.distributed as dist

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
env = " ".join(f"{k}={os.environ[k]}" for k in NAMES)
print(f"plain rank={dist.get_rank()} sum={t.item():g} {env}", flush=True)
dist.destroy_process_group()
