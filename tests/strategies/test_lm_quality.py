"""The language-model table: every strategy, with its defaults, trains the small causal
transformer of ``dmlctl/bench/accuracy_job/lm.py`` on 2 workers, once with AdamW and
once with SGD + Nesterov, and is compared with one process at the same global batch
and the same samples (3 epochs, the bench's default).

Every row must end with one model on every worker (the parameter digests agree; the
hogwild workers share theirs), the causal mask (a buffer of ``-inf``) bit-identical to
what it was, no divergence reported, and a validation loss within the bench's bound
(:meth:`dmlctl.bench.accuracy.Task.within`: 3 % of one process, ssgd 0.5 %) — except
the rows of :data:`SLOWER`, which are held to the gap measured for them (in
``docs/strategies.md``, "A language model", with the setting that closes it).

One strategy's runs share one set of ranks (both optimizers in turn; the parameter
servers serve one model, so those run once per optimizer). The single-process baseline
is measured once per session. ``dmlctl bench accuracy --task lm`` prints the same
table through real ``dmlctl launch`` runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from dmlctl.bench.accuracy import TASKS
from tests.strategies.harness import bench_job, run_ranks

pytestmark = pytest.mark.integration

TASK = TASKS["lm"]
OPTIMIZERS = TASK.optimizers
W2S1 = ["worker", "worker", "server"]
COLLECTIVE = ["ssgd", "local-sgd", "bmuf", "easgd", "admm", "dpsgd", "ensemble", "hogwild"]
SERVERS = ["asgd", "ssp", "adadelay", "easgd-async", "sync-ps", "aadmm"]

SLOWER: dict[str, float] = {
    "easgd": 0.06,
    "admm": 0.10,
    "aadmm": 0.10,
    "ensemble": 0.10,
    "hogwild": 0.08,
    "asgd": 0.12,
    "ssp": 0.12,
    "easgd-async": 0.12,
    "adadelay": 1.5,
}
"""Rows that end more than 3 % above one process at 3 epochs (with one optimizer at
least), and the most they may: the largest gap measured in four runs of the table,
with room for the asynchronous rows' run-to-run spread (AdamW: hogwild 2.1-4.3 %, and
6.8 % in a suite run beside the Slurm lab's tests,
asgd 5.3-6.4 %, ssp 3.7-6.0 %, easgd-async 3.1-6.8 %, adadelay 25-45 %, and adadelay
slows further when the machine is loaded, as on digits: 69 % with AdamW while three
pytest workers shared the 2 cores, 92 % in a suite run beside other tests; its bound
still fails a row that stops learning: the uniform guess is about +430 %); the
synchronous rows are deterministic.
docs/strategies.md ("A language model") says why each lags and what closes the gap: after
9 epochs every row but adadelay is within 3 % (adadelay, which runs plain SGD, after 24)."""


def _train(ctx: Any, optimizers: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """On every rank: one training per optimizer, each from a fresh model."""
    import torch

    torch.set_num_threads(1)
    lm = bench_job("lm")
    return {name: lm.train(ctx, name) for name in optimizers}


@pytest.fixture(scope="session")
def lm_baseline() -> dict[str, float]:
    """Single-process validation loss per optimizer."""
    (result,) = run_ranks(_train, 1, strategy="none", args=(OPTIMIZERS,), timeout=300)
    return {name: r["val_loss"] for name, r in result.items()}


def _check(name: str, workers: list[dict[str, dict[str, Any]]], base: dict[str, float]) -> None:
    assert len(workers) == 2
    bound = SLOWER.get(name, TASK.tolerance(name))
    for opt in workers[0]:
        losses = [w[opt]["val_loss"] for w in workers]
        deltas = [TASK.delta(loss, base[opt]) for loss in losses]
        assert max(deltas) <= bound + 1e-9, (
            f"{name} with {opt}: validation loss {losses} is more than {bound:.1%} above "
            f"one process's {base[opt]:.4f}"
        )
        assert len({w[opt]["digest"] for w in workers}) == 1, (
            f"{name} with {opt}: the workers end with different models"
        )
        assert all(w[opt]["mask_kept"] for w in workers), f"{name} with {opt}: the mask changed"


@pytest.mark.parametrize("strategy", COLLECTIVE)
def test_collective_strategies_train_a_transformer_near_one_process(
    strategy: str, lm_baseline: dict[str, float]
) -> None:
    ranks = run_ranks(_train, 2, strategy=strategy, args=(OPTIMIZERS,), timeout=300)
    _check(strategy, [r for r in ranks if r is not None], lm_baseline)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("strategy", SERVERS)
def test_parameter_server_strategies_train_a_transformer_near_one_process(
    strategy: str, optimizer: str, lm_baseline: dict[str, float]
) -> None:
    ranks = run_ranks(_train, 3, strategy=strategy, args=((optimizer,),), roles=W2S1, timeout=300)
    _check(strategy, [r for r in ranks if r is not None], lm_baseline)
