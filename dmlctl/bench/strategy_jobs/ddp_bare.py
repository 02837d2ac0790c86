# mypy: allow-untyped-calls
"""The baseline of ``dmlctl bench strategies``: the same loop hand-written with DDP.

Run under bare torchrun (``python -m torch.distributed.run --standalone
--nproc-per-node 2 ddp_bare.py``). Same model, data, sampler, batch and steps as
``train.py``; rank 0 prints one JSON line ``{"samples_per_s": …}``: the mean over
ranks of each rank's samples / seconds over the steps after ``--warmup``.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler
from workload import build_model, dataset, loss_of, parse_args

args = parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
net = build_model(args.model)
# The same DDP settings as dmlctl's ssgd defaults, so the ratio measures dmlctl's
# overhead, not a difference in configuration (gradient_as_bucket_view alone is
# worth ~15% here).
model = DistributedDataParallel(net, bucket_cap_mb=25, gradient_as_bucket_view=True)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
data = dataset(args.model, args.steps, args.batch_size, world)
sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
    data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True
)
indices = list(sampler)
start = time.perf_counter()
for step in range(1, args.steps + 1):
    idx = torch.as_tensor(indices[(step - 1) * args.batch_size : step * args.batch_size])
    x, y = data.tensors[0][idx], data.tensors[1][idx]
    loss = loss_of(args.model, model(x), x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step == args.warmup:
        start = time.perf_counter()
rate = torch.tensor([(args.steps - args.warmup) * args.batch_size / (time.perf_counter() - start)])
dist.all_reduce(rate)
if rank == 0:
    print(json.dumps({"samples_per_s": float(rate.item()) / world}), flush=True)
# Leave like dmlctl's rank entry does: skipping interpreter teardown avoids gloo's
# abort-at-exit race in torch 2.13 (pytorch/pytorch#190489) and costs no samples/s.
sys.stdout.flush()
os._exit(0)
