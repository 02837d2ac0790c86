# mypy: allow-untyped-calls
"""The dmlctl side of ``dmlctl bench strategies``: an ordinary dmlctl training loop.

``ctx.log`` runs twice: after ``--warmup`` steps (starts the timed window) and after
the last step, whose record carries ``samples_per_s`` over the timed steps and the
strategy's ``comm_bytes_per_step`` / ``comm_share`` over the same window.
"""

import torch
from workload import build_model, dataset, loss_of, parse_args

import dmlctl

args = parse_args()
torch.set_num_threads(1)
ctx = dmlctl.init(seed=0)
net = build_model(args.model)
model, opt = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01))
data = dataset(args.model, args.steps, args.batch_size, ctx.world_size)
batches = ctx.shard(data, batch_size=args.batch_size, drop_last=True, seed=0)
for step, (x, y) in enumerate(batches, start=1):
    loss = loss_of(args.model, model(x), x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step in (args.warmup, args.steps):
        ctx.log(step=step, loss=loss)
