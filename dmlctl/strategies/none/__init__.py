"""``none``: plain torchrun semantics — :mod:`.params` (torch-free, for the control
plane) and :mod:`.strategy` (nothing to apply)."""
