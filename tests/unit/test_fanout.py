"""transport.fanout: one call on every host at once (real threads, no hosts)."""

from __future__ import annotations

import threading

import pytest

from dmlctl.transport.fanout import MAX_THREADS, on_every, problems


def test_every_call_runs_even_when_one_fails_and_the_first_failure_in_order_is_raised() -> None:
    ran: list[int] = []
    lock = threading.Lock()

    def call(n: int) -> int:
        with lock:
            ran.append(n)
        if n in (3, 40):
            raise ValueError(f"host {n}")
        return n * 2

    items = list(range(3 * MAX_THREADS))  # more than the pool runs at once
    with pytest.raises(ValueError, match="host 3"):
        on_every(items, call)
    assert sorted(ran) == items  # none cancelled for host 3's failure
    assert on_every([1, 2, 5], lambda n: n * 2) == [2, 4, 10]  # in the items' order
    assert on_every([], call) == []
    assert problems(["a", "b", "c"], lambda h: None if h == "b" else f"{h}: down") == [
        "a: down",
        "c: down",
    ]
