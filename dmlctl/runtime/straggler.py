"""An injected straggler, for benchmarks: with ``DMLCTL_STRAGGLER=FACTOR`` (e.g.
``3``) in its environment, the last worker sleeps ``FACTOR − 1`` times as long as its
own step took after every step of :meth:`~dmlctl.runtime.context.Context.shard`, so
it runs ``FACTOR`` times slower than it would — whatever the strategy makes the others
do about it. ``dmlctl bench advise --straggler 3x`` sets it; nothing else does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TypeVar

from dmlctl.protocol import ENV_STRAGGLER

_T = TypeVar("_T")


def straggler_factor(rank: int, world_size: int) -> float:
    """The slowdown of worker ``rank`` of ``world_size``: the factor of
    ``DMLCTL_STRAGGLER`` for the last worker, 1 for the others and when it is unset.
    ValueError when it is set but not a number ≥ 1."""
    text = os.environ.get(ENV_STRAGGLER)
    if not text or rank != world_size - 1:
        return 1.0
    try:
        factor = float(text)
    except ValueError:
        factor = 0.0
    if not factor >= 1.0:
        raise ValueError(f"{ENV_STRAGGLER}={text!r}: expected a slowdown factor ≥ 1, e.g. 3")
    return factor


def paced(items: Iterator[_T], factor: float) -> Iterator[_T]:
    """``items`` unchanged; with ``factor`` > 1, after each item's step (the time until
    the next item is asked for) sleep ``factor − 1`` times that step."""
    if factor <= 1.0:
        yield from items
        return
    for item in items:
        given = time.perf_counter()
        yield item
        time.sleep((factor - 1.0) * (time.perf_counter() - given))
