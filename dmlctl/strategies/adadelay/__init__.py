"""``adadelay``: asynchronous SGD with a delay-adaptive step — :mod:`.params`
(torch-free, for the control plane) and :mod:`.strategy` (the worker's side, torch)."""
