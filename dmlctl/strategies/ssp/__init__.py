"""``ssp``: stale synchronous parallel on parameter servers — :mod:`.params`
(torch-free, for the control plane) and :mod:`.strategy` (the worker's side, torch)."""
