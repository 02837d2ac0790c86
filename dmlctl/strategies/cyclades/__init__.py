"""``cyclades``: conflict-free asynchronous SGD for sparse problems — :mod:`.params`
and :mod:`.plan` (torch-free) and :mod:`.strategy` (the workers' side, torch)."""
