"""The run's store as the ranks use it: every value signed, every value checked.

Any process that reaches the run's store can write a key (torch's store has no
authentication; dmlctl's server admits only the cluster's hosts, not only the run's
processes). So every value a rank writes there is signed with the run key
(:mod:`dmlctl.run_key`), bound to its key's name so that a signed value copied under
another key is a forgery too, and every value a rank reads is checked before it is
acted on:

* read (:meth:`SignedStore.get`), a value no rank signed raises :class:`ForgedValue`;
* looked for (:meth:`SignedStore.check`, :meth:`SignedStore.wait`), it counts as not
  there: it is deleted (the real writer may write it again) and said once on stderr.

Counters (:meth:`SignedStore.add`) cannot be signed (the store adds to them); what a
counter says is only ever used to find signed values. Without a run key (a rank run
by hand, the test harness) values are written and read as they are.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from datetime import timedelta

from torch._C._distributed_c10d import Store

from dmlctl import run_key

POLL_S = 0.05
"""How often :meth:`SignedStore.wait` looks again after it removed a forged value."""


_SAID: set[str] = set()
"""The keys whose forgery this process said (once each, whichever wrapper found it)."""


class ForgedValue(RuntimeError):
    """A value in the run's store that is not signed with the run key: another process
    wrote it (it is never acted on)."""


class SignedStore:
    """``raw`` (a torch store) with signed values (see the module docstring)."""

    def __init__(self, raw: Store, key: bytes | None = None) -> None:
        #: The torch store itself: for what needs one (a process group's rendezvous).
        self.raw = raw
        self._key = key if key is not None else run_key.key()

    def set(self, name: str, value: str | bytes) -> None:
        """Write ``value`` under ``name``, signed; returns once the store holds it.
        torch's client sends a set without waiting for an answer, and a store serves
        each connection on its own: another process could otherwise look for the
        value before it is there (the server checking the workers' "joined" marks
        found one missing). The check that follows on the same connection is answered
        after the set is done."""
        data = value.encode() if isinstance(value, str) else value
        self.raw.set(name, self._sign(name, data))  # type: ignore[arg-type]  # bytes
        self.raw.check([name])

    def get(self, name: str) -> bytes:
        """The value under ``name`` (waits until there is one, as torch's ``get``);
        :class:`ForgedValue` if no rank of the run signed it."""
        value = self._verify(name, self.raw.get(name))
        if value is None:
            raise ForgedValue(
                f"the run's store holds a value under {name!r} that no rank of the run wrote"
            )
        return value

    def check(self, names: Sequence[str]) -> bool:
        """Whether a signed value is under every one of ``names``; a forged one found is
        deleted and counts as missing."""
        if not self.raw.check(list(names)):
            return False
        forged = [n for n in names if self._verify(n, self.raw.get(n)) is None]
        for name in forged:
            self._drop(name)
        return not forged

    def wait(self, names: Sequence[str], timeout: timedelta) -> None:
        """Wait until a signed value is under every one of ``names`` (torch's
        ``RuntimeError`` after ``timeout``)."""
        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            left = max(deadline - time.monotonic(), 0.001)
            self.raw.wait(list(names), timedelta(seconds=left))
            if self.check(names):
                return
            time.sleep(POLL_S)  # a forgery was removed: its real writer may come

    def compare_set(self, name: str, expected: str, desired: str) -> bytes:
        """torch's ``compare_set`` on signed values (``expected`` empty: only if no value
        is there); returns the value there after it, checked."""
        signed_expected = self._sign(name, expected.encode()) if expected else b""
        current = self.raw.compare_set(name, signed_expected, self._sign(name, desired.encode()))  # type: ignore[arg-type]
        value = self._verify(name, current)
        if value is None:
            raise ForgedValue(
                f"the run's store holds a value under {name!r} that no rank of the run wrote"
            )
        return value

    def delete_key(self, name: str) -> bool:
        return bool(self.raw.delete_key(name))

    def add(self, name: str, amount: int) -> int:
        """torch's ``add``: a counter, not signed (see the module docstring)."""
        return int(self.raw.add(name, amount))

    def _sign(self, name: str, value: bytes) -> bytes:
        return run_key.sign(value, self._key, name=name)

    def _verify(self, name: str, signed: bytes) -> bytes | None:
        return run_key.verify(signed, self._key, name=name)

    def _drop(self, name: str) -> None:
        """Delete the forged value under ``name``; said once per key."""
        self.raw.delete_key(name)
        if name not in _SAID:
            _SAID.add(name)
            print(
                f"dmlctl: removed a forged value under {name!r} from the run's store "
                "(not written by a rank of this run)",
                file=sys.stderr,
                flush=True,
            )
