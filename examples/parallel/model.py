"""The example transformer: about 3.3 million parameters, written so dmlctl's default
plans split it (an ``nn.Sequential`` of blocks; linear layers named ``wq``/``wk``/``wv``/
``wo`` and ``w1``/``w2``; attention reshaping with ``-1`` heads).

It ships with dmlctl, in ``dmlctl/bench/parallel_job/model.py``, so that
``dmlctl bench parallel`` measures this very model; read it there.
"""

from dmlctl.bench.parallel_job.model import Config, loss_fn, transformer

__all__ = ["Config", "loss_fn", "transformer"]
