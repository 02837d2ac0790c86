"""Train the example transformer (``model.py``) as a byte-level language model on
text that ships with Python (the source of a few standard-library modules), under
whatever layout the job's ``parallelism:`` block gives it: the loop is the same for
all of them (``ctx.train_step`` runs a pipeline's schedule when there is one).

    python train.py                      # one process, the whole model
    dmlctl launch tensor.yaml            # or pipeline-gpipe.yaml, fsdp.yaml, ...

Prints the validation loss before and after training.
"""

from __future__ import annotations

import argparse
import importlib
import inspect

import torch
from model import Config, loss_fn, transformer

import dmlctl

MODULES = ("json.decoder", "json.encoder", "argparse", "textwrap", "string", "dataclasses")


def corpus() -> torch.Tensor:
    """The bytes of a few standard-library modules' source, as token ids."""
    text = "\n".join(inspect.getsource(importlib.import_module(m)) for m in MODULES)
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def windows(tokens: torch.Tensor, context: int) -> torch.utils.data.TensorDataset:
    """Non-overlapping (input, next-token target) windows of ``context`` tokens."""
    n = (len(tokens) - 1) // context
    x = tokens[: n * context].view(n, context)
    y = tokens[1 : n * context + 1].view(n, context)
    return torch.utils.data.TensorDataset(x, y)


def evaluate(
    ctx: dmlctl.Context, model: torch.nn.Module, data: torch.utils.data.TensorDataset
) -> float:
    """Mean loss over the first 64 validation windows (every rank takes part)."""
    x, y = data.tensors[0][:64], data.tensors[1][:64]
    total = 0.0
    for i in range(0, len(x), 16):
        total += float(ctx.eval_step(model, x[i : i + 16], y[i : i + 16], loss_fn))
    return total / (len(x) // 16)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60, help="training steps")
    parser.add_argument("--batch-size", type=int, default=8, help="per data-parallel replica")
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ctx = dmlctl.init(seed=0)
    cfg = Config()
    tokens = corpus()
    split = int(0.9 * len(tokens))
    train, valid = windows(tokens[:split], cfg.context), windows(tokens[split:], cfg.context)
    model = transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, opt = ctx.prepare(model, opt)
    step = ctx.resume(model, opt)
    before = evaluate(ctx, model, valid)
    epochs = -(-args.steps * args.batch_size * ctx.data_parallel_size // len(train))
    ctx.total_steps = args.steps
    for x, y in ctx.shard(train, batch_size=args.batch_size, epochs=epochs, drop_last=True):
        if step >= args.steps:
            break
        loss = ctx.train_step(model, x, y, loss_fn)
        opt.step()
        opt.zero_grad()
        step += 1
        ctx.log(step=step, loss=loss)
        ctx.checkpoint(step, model, opt)
    after = evaluate(ctx, model, valid)
    if ctx.is_main:
        print(f"validation loss {before:.3f} -> {after:.3f} after {step} steps", flush=True)


if __name__ == "__main__":
    main()
