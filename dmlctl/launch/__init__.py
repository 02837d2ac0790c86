"""dmlctl.launch."""
