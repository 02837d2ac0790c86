"""Parameter-server core: shard planning, the worker/server channel and the server.

* :mod:`dmlctl.ps.shards` — pure, torch-free: which parameter tensors each server holds.
* :mod:`dmlctl.ps.channel` — push/pull messages between worker and server ranks over
  ``torch.distributed`` point-to-point (gloo), behind small classes so the transport
  can be replaced.
* :mod:`dmlctl.ps.server` — :class:`~dmlctl.ps.server.ParameterServer`: the shards'
  parameters, SGD updates as pushes arrive, per-worker clocks, measured staleness,
  ``state_dict`` for checkpoints.

Importing this package is cheap (no torch); import the submodules you need.
"""
