"""dmlctl.runs."""
