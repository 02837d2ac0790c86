"""The setup step's per-host view: state and last output line of every host."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

SETUP_TAIL = 15


class SetupView:
    """Per-host state of the setup step, rendered as a small table."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.lock = threading.Lock()
        self.last = dict.fromkeys(hosts, "starting…")
        self.state = dict.fromkeys(hosts, "running")
        self.tails = {h: collections.deque[str](maxlen=SETUP_TAIL) for h in hosts}
        self.started = time.monotonic()

    def render(self) -> Table:
        table = Table(box=None, title="setup", title_justify="left", show_header=False)
        with self.lock:
            for host, line in self.last.items():
                style = {"running": "yellow", "ok": "green", "failed": "bold red"}[self.state[host]]
                table.add_row(
                    Text(host),
                    Text(self.state[host], style=style),
                    Text(line[-100:], overflow="ellipsis", no_wrap=True),
                )
        return table
