"""``admm``: consensus ADMM — :mod:`.params` (torch-free, for the control plane) and
:mod:`.strategy` (the optimizer, torch)."""
