"""A tiny character-level transformer that learns to write sums like "37+45=82".

Run it anywhere:
    python train.py                                          # one process
    torchrun --standalone --nproc-per-node 2 train.py        # two processes, by hand
    dmlctl launch job.yaml                                   # on the hosts of your cluster

The data is generated from a fixed seed, so no download is needed. The digits of
the operands are random, the rest (format and the answer) can be learned: the loss
starts near ln(13) = 2.56 and falls well below 1.5.
"""

import argparse
import random
import time

import torch
import torch.nn.functional as F
from torch import nn

import dmlctl

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--batch-size", type=int, default=32, help="per worker")
parser.add_argument("--log-every", type=int, default=10)
args = parser.parse_args()

torch.set_num_threads(1)  # one core per worker: several workers share a machine
ctx = dmlctl.init(seed=0)  # rank, world size, device, strategy: all from the environment

# ---- data: "a+b=c\n" lines, cut into blocks of characters ---------------------------
VOCAB = "0123456789+=\n"
BLOCK = 32
rng = random.Random(1234)  # same text on every rank; ctx.shard splits it
lines = []
for _ in range(12_000):
    a, b = rng.randrange(100), rng.randrange(100)
    lines.append(f"{a}+{b}={a + b}\n")
text = "".join(lines)
ids = torch.tensor([VOCAB.index(ch) for ch in text])
n_blocks = (len(ids) - 1) // BLOCK
x = ids[: n_blocks * BLOCK].view(n_blocks, BLOCK)
y = ids[1 : n_blocks * BLOCK + 1].view(n_blocks, BLOCK)
dataset = torch.utils.data.TensorDataset(x, y)


# ---- model: a 2-layer causal transformer ----------------------------------------------
class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, d: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                       norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        for block in self.blocks:
            h = block(h, src_mask=mask, is_causal=True)
        return self.head(self.norm(h))


model = TinyGPT(len(VOCAB), BLOCK)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
model, optimizer = ctx.prepare(model, optimizer)  # e.g. DDP for strategy "ssgd"

# ---- train --------------------------------------------------------------------------
start = time.time()
step = 0
for xb, yb in ctx.shard(dataset, batch_size=args.batch_size, epochs=args.epochs):
    logits = model(xb)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), yb.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    step += 1
    if step % args.log_every == 0:
        ctx.log(step=step, loss=loss, epoch=ctx.epoch)
    if step == args.steps:
        break

final = ctx.all_reduce_mean(loss)  # every rank calls it: it is a collective
if ctx.is_main:
    print(f"done: {step} steps on {ctx.world_size} worker(s) in {time.time() - start:.1f}s, "
          f"final loss {final:.4f}")
