"""Parameter-server core: shard planning, the worker/server channel and the server.

* :mod:`dmlctl.ps.shards` — pure, torch-free: which parameter tensors each server holds.
* :mod:`dmlctl.ps.channel` — push/pull messages between worker and server ranks,
  behind small classes; :mod:`dmlctl.ps.frames` — the TCP connections they travel on
  (the channel's own, found through the run's store).
* :mod:`dmlctl.ps.server` — :class:`~dmlctl.ps.server.ParameterServer`: the shards'
  parameters, SGD updates as pushes arrive, per-worker clocks, measured staleness,
  ``state_dict`` for checkpoints; :mod:`dmlctl.ps.serve` — a server rank's life.
* :mod:`dmlctl.ps.bootstrap` — the layout the workers and servers agree on, and a
  worker's joining (:func:`~dmlctl.ps.bootstrap.join_as_worker`).
* :mod:`dmlctl.ps.worker` — :class:`~dmlctl.ps.worker.PSOptimizer`, the worker's side;
  :mod:`dmlctl.ps.modes` — the generic push modes shared by several strategies
  (``DeltaPush``, ``GradientPush``); a strategy's own worker (easgd-async, aadmm,
  sync-ps) is its package's ``mode`` module.

Importing this package is cheap (no torch); import the submodules you need.
"""
