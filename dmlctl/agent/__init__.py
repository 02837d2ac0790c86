"""The host agent (data plane): runs torchrun for one host and owns its process tree."""
