"""dmlctl.plan."""
