"""A tiny character-level transformer that learns to write sums like "37+45=82".

Run it anywhere:
    python train.py                                          # one process
    torchrun --standalone --nproc-per-node 2 train.py        # two processes, by hand
    dmlctl launch job.yaml                                   # on the hosts of your cluster

The data is generated from a fixed seed, so no download is needed. The loss starts
near ln(13) = 2.56 (13 characters) and falls below 1.4 in about 10 seconds on two
CPU cores. It cannot reach 0: the operands' digits are random (about 1.1 nats per
character); only the format and the answers can be learned.
"""

import argparse
import random
import time

import torch
import torch.nn.functional as F
from torch import nn

import dmlctl

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
parser.add_argument("--lr", type=float, default=6e-3)
parser.add_argument("--batch-size", type=int, default=32, help="per worker")
parser.add_argument("--log-every", type=int, default=20)
args = parser.parse_args()

torch.set_num_threads(1)  # one core per worker: several workers share a machine
ctx = dmlctl.init(seed=0)  # rank, world size, device, strategy: all from the environment

# ---- data: "a+b=c\n" lines, cut into blocks of characters ---------------------------
VOCAB = "0123456789+=\n"
BLOCK = 32
rng = random.Random(1234)  # same text on every rank; ctx.shard splits it
lines = []
for _ in range(24_000):
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
            nn.TransformerEncoderLayer(
                d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True
            )
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
        logits: torch.Tensor = self.head(self.norm(h))
        return logits


net = TinyGPT(len(VOCAB), BLOCK)
# The strategy wraps both (ssgd: DistributedDataParallel); use what it returns.
model, optimizer = ctx.prepare(net, torch.optim.AdamW(net.parameters(), lr=args.lr))

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
    print(
        f"done: {step} steps on {ctx.world_size} worker{'s' * (ctx.world_size != 1)} "
        f"in {time.time() - start:.1f}s, "
        f"final loss {final:.4f}"
    )
