# mypy: allow-untyped-calls
"""Training script of the in-place side of the recovery benchmark (``dmlctl bench
recovery --mode in_place``).

``train.py``'s problem (a tiny linear model, ``--sleep`` seconds of "compute" per
step) under a parameter-server strategy through dmlctl's API (``dmlctl.init``,
``ctx.prepare``, ``ctx.shard``), so that ``restart.mode: in_place`` can replace a
lost worker: each worker takes ``--steps`` batches of 32 samples. A server rank
never runs this script (dmlctl serves in it).

The fault: on the first attempt, the first process of worker ``--kill-rank``
records the time and SIGKILLs itself right after completing step ``--kill-at``; its
replacement (``DMLCTL_REJOIN`` set) goes on from its data position.

Timing: the lines of ``train.py`` (``KIND STEP TIME ATTEMPT``, in
``<timing-dir>/rank-<R>.timing``), where a replacement counts as the next attempt
(``ATTEMPT`` = dmlctl's attempt − 1 + the replacements so far), ``joined`` is
``dmlctl.init`` done, ``built`` the prepared model, and ``resumed_from`` the batches
its predecessors had taken (``ctx.resume``).
"""

import time

START = time.time()  # before torch: the import is part of what a restart costs

import os  # noqa: E402
import signal  # noqa: E402

import torch  # noqa: E402

import dmlctl  # noqa: E402
from dmlctl.bench.recovery_job.train import FEATURES, Timing, arguments, attempt  # noqa: E402

IMPORTED = time.time()
BATCH = 32


def main() -> None:
    """Train, record timings; kill ``--kill-rank``'s first process on the first attempt."""
    args = arguments(__doc__ or "", checkpoints=False).parse_args()
    ctx = dmlctl.init(seed=0)
    replaced = int(os.environ.get("DMLCTL_REJOIN") or 0)
    rank = ctx.global_rank
    timing = Timing(args.timing_dir, rank, attempt() + replaced)
    timing.record("start", when=START)
    timing.record("imported", when=IMPORTED)
    timing.record("joined")
    net = torch.nn.Linear(FEATURES, 1)
    sgd = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    model, optim = ctx.prepare(net, sgd)
    timing.record("built")
    step = ctx.resume(model, optim)
    timing.record("resumed_from", step)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.steps * BATCH * ctx.world_size, FEATURES, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    for xb, yb in ctx.shard(data, batch_size=BATCH, epochs=1):
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        optim.zero_grad()
        time.sleep(args.sleep)
        loss.backward()
        optim.step()
        step += 1
        timing.record("step", step)
        if step % 50 == 0:
            ctx.log(step=step, loss=loss)
        if attempt() == 0 and not replaced and rank == args.kill_rank and step == args.kill_at:
            timing.record("kill", step)
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
