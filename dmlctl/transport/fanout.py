"""One call on every host at once: the thread pool the control plane talks to its
hosts through (a copy, a probe, a check), bounded so a large cluster does not start
thousands of threads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_THREADS = 32
"""Most calls running at once."""


def on_every(items: Sequence[T], call: Callable[[T], R]) -> list[R]:
    """``call(item)`` for every item at once (at most :data:`MAX_THREADS` threads; none
    for no items), once all are done; the results in the items' order. The first
    exception a call raised, in that order, is raised here, after every call ran (none
    is cancelled for another's failure)."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_THREADS, len(items))) as pool:
        futures = [pool.submit(call, item) for item in items]
        wait(futures)
        return [f.result() for f in futures]


def problems(items: Sequence[T], call: Callable[[T], str | None]) -> list[str]:
    """:func:`on_every` for calls that return a problem line or None (all went well):
    the problem lines, in the items' order."""
    return [p for p in on_every(items, call) if p is not None]
