"""What a benchmark says before it starts: how many runs it plans and about how long
they take on this machine's reference, 2 cores (torch-free). Each bench counts its
runs next to the loop that makes them; the seconds per run are measured with its
defaults and scaled by the option that sets a run's length."""

from __future__ import annotations

from rich.console import Console

from dmlctl.text import plural
from dmlctl.ui.format import format_duration

REFERENCE = "on 2 cores"
"""Where the seconds per run were measured."""


def planned(count: int, breakdown: str, each_s: float) -> str:
    """``10 runs (5 repeats × 2 launchers) of about 4 s each on 2 cores: about
    0:00:40`` (one run: ``1 run of about 0:00:06 on 2 cores``); ``breakdown`` says where
    the count comes from (empty: left out)."""
    why = f" ({breakdown})" if breakdown else ""
    if count == 1:
        return f"1 run{why} of about {format_duration(each_s)} {REFERENCE}"
    return (
        f"{plural(count, 'run')}{why} of about {each_s:.0f} s each {REFERENCE}: "
        f"about {format_duration(count * each_s)}"
    )


def announce(console: Console, bench: str, plan: str) -> None:
    """Say ``plan`` (from :func:`planned`) on ``console`` before ``bench`` starts."""
    console.print(f"dmlctl bench {bench}: {plan}", highlight=False, markup=False, soft_wrap=True)
