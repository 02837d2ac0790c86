"""``python -m dmlctl``."""

from dmlctl.cli.app import main

main()
