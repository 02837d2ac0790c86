# mypy: allow-untyped-calls
"""A small causal transformer language model on a generated text: the workload of
``dmlctl bench accuracy --task lm`` and of the language-model table in the test suite
(``tests/strategies/test_lm_quality.py``).

Text: :func:`text` writes sentences of a small English-like grammar (determiners,
adjectives, nouns with their plurals, verbs that agree with their subject, objects,
prepositional phrases, numbers) from a fixed seed with Python's own ``random`` — the
same characters on every machine, nothing downloaded. The characters are the tokens
(a vocabulary of :data:`VOCAB`). Training windows of :data:`SEQ` + 1 characters start
every :data:`STRIDE` characters of the first 90 % (4,496 windows of 36,000
characters); validation is every disjoint window of the last 10 % (124 windows, fixed,
the same on every rank).

Model (:class:`CharLM`): a token embedding, a learned position embedding, two pre-norm
blocks (width 32, 4 heads, a GELU MLP of width 64, no dropout) whose attention
(``scaled_dot_product_attention``) adds the causal mask
``nn.Transformer.generate_square_subsequent_mask`` makes — a buffer of ``-inf``, which
no strategy may average — and a linear head: 20,061 parameters.

Training: ``epochs`` passes (3) of ``ctx.shard`` with a **global** batch of
:data:`GLOBAL_BATCH` windows split over the data-parallel workers (one process takes
all of it: the same global batch and the same samples in the same number of steps),
AdamW (lr 2e-2, weight decay 0.01) or SGD with Nesterov momentum 0.9 (lr 0.5), a
linear warm-up over the first 5 % of the steps then a cosine decay to a tenth,
gradients clipped at norm 1, the strategy's defaults. One process ends at about 0.64
(AdamW) and 0.68 (Nesterov) nats per character after 3 epochs, 0.59 and 0.60 after 6.
The validation loss (mean cross-entropy per character) is measured on the model each
rank holds at the end (after the strategy's final model).

Run by dmlctl (a job whose script is this file) it logs ``loss`` every 10 steps and,
on rank 0, ``val_loss`` at the end, and prints ``val_loss=1.2345``.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dmlctl.bench.accuracy_job.common import digest, run_script

OPTIMIZERS = ("adamw", "nesterov")
PLAIN_SGD = "sgd"
"""Plain SGD (lr 2, AdaDelay's step from the AdamW default): asked for by name only,
to compare adadelay, which replaces the optimizer with plain SGD, with its own kind."""
CHOICES = (*OPTIMIZERS, PLAIN_SGD)
VOCAB = " .,abcdefghijklmnopqrstuvwxyz"
SEQ = 32
STRIDE = 8
CHARACTERS = 40_000
GLOBAL_BATCH = 32
EPOCHS = 3
WARMUP = 0.05
FLOOR = 0.1
WIDTH = 32
HEADS = 4
LAYERS = 2

_DETERMINERS = ("the", "a", "every", "no", "some", "one")
_ADJECTIVES = ("small", "red", "old", "quiet", "happy", "green", "tall", "cold", "bright")
_NOUNS = (
    ("cat", "cats"),
    ("dog", "dogs"),
    ("bird", "birds"),
    ("child", "children"),
    ("farmer", "farmers"),
    ("river", "rivers"),
    ("house", "houses"),
    ("teacher", "teachers"),
    ("fox", "foxes"),
    ("tree", "trees"),
)
_VERBS = (
    ("sees", "see"),
    ("likes", "like"),
    ("finds", "find"),
    ("follows", "follow"),
    ("watches", "watch"),
    ("carries", "carry"),
    ("paints", "paint"),
)
_PREPOSITIONS = ("near", "under", "behind", "with", "beside")
_NUMBERS = ("two", "three", "four", "five", "six", "seven")


def _noun_phrase(rng: random.Random) -> tuple[str, bool]:
    """A noun phrase and whether it is plural."""
    singular, plural = rng.choice(_NOUNS)
    if rng.random() < 0.25:
        words = [rng.choice(_NUMBERS), plural]
        many = True
    else:
        many = rng.random() < 0.3
        words = ["the" if many else rng.choice(_DETERMINERS), plural if many else singular]
    if rng.random() < 0.4:
        words.insert(1, rng.choice(_ADJECTIVES))
    return " ".join(words), many


def _sentence(rng: random.Random) -> str:
    subject, many = _noun_phrase(rng)
    verb = rng.choice(_VERBS)[1 if many else 0]
    obj, _ = _noun_phrase(rng)
    words = [subject, verb, obj]
    if rng.random() < 0.35:
        words += [rng.choice(_PREPOSITIONS), _noun_phrase(rng)[0]]
    end = ", and " if rng.random() < 0.15 else ". "
    return " ".join(words) + end


def text(characters: int = CHARACTERS, seed: int = 0) -> str:
    """``characters`` characters of the grammar's sentences (deterministic)."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < characters:
        parts.append(_sentence(rng))
        size += len(parts[-1])
    return "".join(parts)[:characters]


def data(
    characters: int = CHARACTERS,
) -> tuple[torch.utils.data.TensorDataset, tuple[torch.Tensor, torch.Tensor]]:
    """The training windows and the validation (input, target) tensors."""
    ids = torch.tensor([VOCAB.index(c) for c in text(characters)], dtype=torch.int64)
    cut = int(len(ids) * 0.9)
    train = ids[:cut].unfold(0, SEQ + 1, STRIDE)
    val = ids[cut:].unfold(0, SEQ + 1, SEQ)
    return (
        torch.utils.data.TensorDataset(train[:, :-1], train[:, 1:]),
        (val[:, :-1].contiguous(), val[:, 1:].contiguous()),
    )


class Block(nn.Module):
    """A pre-norm transformer block: causal multi-head attention (PyTorch's
    ``scaled_dot_product_attention`` under the additive ``mask``) and a GELU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, _ = h.shape
        q, k, v = (
            self.qkv(self.norm1(h)).view(b, n, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        )
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = h + self.proj(attended.transpose(1, 2).reshape(b, n, WIDTH))
        out: torch.Tensor = h + self.down(F.gelu(self.up(self.norm2(h))))
        return out


class CharLM(nn.Module):
    """Embeddings, :data:`LAYERS` causal blocks and a linear head (module docstring).
    The causal mask is a buffer of ``-inf`` above the diagonal, as
    ``nn.Transformer.generate_square_subsequent_mask`` makes it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), WIDTH)
        self.position = nn.Parameter(torch.randn(SEQ, WIDTH) * 0.02)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, len(VOCAB))
        self.mask: torch.Tensor
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.embed(x) + self.position[:n]
        for block in self.blocks:
            h = block(h, self.mask[:n, :n])
        out: torch.Tensor = self.head(self.norm(h))
        return out


def model(seed: int) -> CharLM:
    """A fresh :class:`CharLM` from ``seed``."""
    torch.manual_seed(seed)
    return CharLM()


def optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    """``adamw``: AdamW lr 2e-2, weight decay 0.01; ``nesterov``: SGD lr 0.5, Nesterov
    momentum 0.9; ``sgd`` (:data:`PLAIN_SGD`): SGD lr 2, no momentum."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=2e-2, weight_decay=0.01)
    if name == "nesterov":
        return torch.optim.SGD(params, lr=0.5, momentum=0.9, nesterov=True)
    if name == PLAIN_SGD:
        return torch.optim.SGD(params, lr=2.0)
    raise ValueError(f"optimizer must be one of {', '.join(CHOICES)}, got {name!r}")


def schedule(opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning rate over ``steps`` steps: a linear warm-up over the first
    :data:`WARMUP` of them, then a cosine decay to :data:`FLOOR` of the peak."""
    warm = max(1, int(steps * WARMUP))

    def factor(step: int) -> float:
        cosine = 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))
        return min(1.0, (step + 1) / warm) * (FLOOR + (1 - FLOOR) * cosine)

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def loss_of(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per character (nats)."""
    logits = net(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def train(
    ctx: Any,
    opt_name: str,
    epochs: int = EPOCHS,
    global_batch: int = GLOBAL_BATCH,
    seed: int = 0,
    characters: int = CHARACTERS,
) -> dict[str, Any]:
    """Train with the job's strategy; this rank's validation loss, parameter digest,
    final training loss and whether the mask is still what it was (module docstring)."""
    train_set, (x_val, y_val) = data(characters)
    net = model(seed)
    mask = net.mask.clone()
    net, opt = ctx.prepare(net, optimizer(opt_name, net.parameters()))
    batch = max(1, global_batch // ctx.data_parallel_size)
    decay = schedule(opt, epochs * math.ceil(len(train_set) / (batch * ctx.data_parallel_size)))
    loss = torch.zeros(())
    for step, (x, y) in enumerate(
        ctx.shard(train_set, batch_size=batch, epochs=epochs, seed=seed), 1
    ):
        loss = loss_of(net, x, y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        decay.step()
        if step % 10 == 0:
            ctx.log(loss=loss)
    core = getattr(net, "module", net)
    with torch.no_grad():
        val = float(loss_of(net, x_val.to(ctx.device), y_val.to(ctx.device)).item())
    return {
        "val_loss": val,
        "digest": digest(net),
        "loss": float(loss.item()),
        "mask_kept": bool(torch.equal(core.mask.cpu(), mask)),
    }


def main() -> None:
    run_script(
        __doc__ or "",
        train,
        CHOICES,
        epochs=EPOCHS,
        batch=GLOBAL_BATCH,
        batch_help="global batch (windows)",
        metric="val_loss",
    )


if __name__ == "__main__":
    main()
