"""dmlctl.bench."""
