"""``hogwild``: lock-free SGD on parameters shared in memory — :mod:`.params`
(torch-free, for the control plane) and :mod:`.strategy` (torch)."""
