"""Exercise the runtime API on every rank and write what it saw to OUT/probe-<rank>.json.

Usage: python runtime_probe.py OUT   (plain, or under torchrun with any world size)
"""

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import dmlctl
from dmlctl.runtime import current

N_SAMPLES = 40


class DictDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Map-style dataset of dicts: exercises collation and device moves of mappings."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"i": torch.tensor(i), "x": torch.full((2,), float(i))}


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    ctx = dmlctl.init()
    result: dict[str, Any] = {
        "same_context": dmlctl.init() is ctx and current() is ctx,
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "local_rank": ctx.local_rank,
        "local_world_size": ctx.local_world_size,
        "role": ctx.role,
        "strategy": ctx.strategy,
        "params": ctx.strategy_params.model_dump(),
        "device": str(ctx.device),
        "is_main": ctx.is_main,
    }

    # Sharding: which sample indices this rank sees, per epoch, in order.
    shard: dict[int, list[int]] = {}
    for batch in ctx.shard(torch.arange(N_SAMPLES), batch_size=4, epochs=2):
        shard.setdefault(ctx.epoch, []).extend(batch.tolist())
    result["shard"] = shard
    dict_batches = list(ctx.shard(DictDataset(), batch_size=5, shuffle=False))
    result["dict_batch_keys"] = sorted(dict_batches[0])
    result["dict_indices"] = [i for b in dict_batches for i in b["i"].tolist()]

    # Strategy: replicas built differently on purpose; after prepare + steps they agree.
    torch.manual_seed(100 + ctx.rank)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model, optimizer = ctx.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    result["wrapped"] = type(model).__name__
    start = torch.cat([p.detach().flatten() for p in net.parameters()]).clone()
    x = torch.randn(16, 4)  # different data on every rank
    for _ in range(3):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ctx.log(loss=loss, lr=0.1)
    ctx.log(step=10, loss=torch.tensor(0.5))
    ctx.log(loss=0.25)  # automatic step: 11
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(ctx.world_size)]
    if ctx.world_size > 1:
        dist.all_gather(gathered, flat)
    else:
        gathered = [flat]
    result["param_max_diff"] = max(float((g - gathered[0]).abs().max()) for g in gathered)
    result["params_moved"] = float((flat - start).abs().max())
    result["mean_of_ranks"] = ctx.all_reduce_mean(float(ctx.rank))
    result["mean_of_tensor"] = ctx.all_reduce_mean(torch.tensor([2.0 * ctx.rank]))
    ctx.barrier()
    (out / f"probe-{ctx.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
