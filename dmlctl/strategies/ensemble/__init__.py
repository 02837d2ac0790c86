"""``ensemble``: aggregation by model ensemble (ensemble-then-compress) — :mod:`.params`
(torch-free, for the control plane) and :mod:`.strategy` (the optimizer, torch)."""
