"""``sync-ps``: synchronous SGD on parameter servers with backup workers."""
