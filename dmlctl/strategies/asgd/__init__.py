"""``asgd``: asynchronous SGD on parameter servers — :mod:`.params`
(torch-free, for the control plane) and :mod:`.strategy` (the worker's side, torch)."""
