"""``bmuf``: block-wise model update filtering — :mod:`.params` (torch-free, for the
control plane) and :mod:`.strategy` (the optimizer, torch)."""
