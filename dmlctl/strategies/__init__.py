"""dmlctl.strategies."""
