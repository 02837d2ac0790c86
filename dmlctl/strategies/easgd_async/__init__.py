"""``easgd-async``: asynchronous elastic averaging — :mod:`.params`
(torch-free, for the control plane) and :mod:`.strategy` (the worker's side, torch)."""
