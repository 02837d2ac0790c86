"""``local-sgd``: model averaging — :mod:`.params` (torch-free, for the control plane)
and :mod:`.strategy` (the optimizer, torch)."""
