"""``ssgd``: synchronous SGD (DDP), with optional gradient compression —
:mod:`.params` (torch-free, for the control plane), :mod:`.strategy` and
:mod:`.compression` (torch)."""
