"""dmlctl.ui: rich renderables over RunState snapshots, and a plain line mode.

Nothing here does SSH, process or file work; callers pass snapshots and a console
or text stream.
"""

from dmlctl.ui.dashboard import LiveDashboard, render_dashboard
from dmlctl.ui.plain import PlainPrinter
from dmlctl.ui.summary import render_run_detail, render_run_list, render_summary

__all__ = [
    "LiveDashboard",
    "PlainPrinter",
    "render_dashboard",
    "render_run_detail",
    "render_run_list",
    "render_summary",
]
