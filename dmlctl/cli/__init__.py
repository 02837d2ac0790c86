"""dmlctl.cli."""
