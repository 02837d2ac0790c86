"""A rank's heartbeat: a daemon thread that records, once a second, that the process
is alive and what it is doing (torch-free: it reads torch's flight recorder only
when the script has loaded torch.distributed).

The runtime entry starts it before the training script runs, so every rank process
beats from its first second to its last, whether or not the script uses the dmlctl
runtime. Each beat is one ``heartbeat`` record (keys: :data:`dmlctl.protocol.BEAT_KEYS`):
the progress tracker's view (:mod:`dmlctl.runtime.progress`), the main thread's
position (:mod:`dmlctl.runtime.where`) and the collectives per process group
(:mod:`dmlctl.runtime.collectives`). (The rank's CPU and I/O use are sampled from
outside, by the host agent: they go on being known when the rank stops beating.)

Liveness and progress are separate signals for the controller: a frozen process
(SIGSTOP, an interpreter whose lock is never released) stops beating; a rank in a
long phase keeps beating while its progress stands still. Cost: one short line a
second and well under a millisecond of work (a stack walk of the main thread, a
flight-recorder dump of at most a few hundred entries).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

from dmlctl.protocol import STAGE_SERVING, RankEventWriter
from dmlctl.runtime import collectives, guards
from dmlctl.runtime.progress import TRACKER, Tracker
from dmlctl.runtime.where import FrameNamer, frames_of

INTERVAL_S = 1.0


def main_thread_frames() -> list[tuple[str, int, str]]:
    """The main thread's stack now, innermost first (see :func:`frames_of`)."""
    ident = threading.main_thread().ident
    return frames_of(sys._current_frames().get(ident) if ident is not None else None)


def main_thread_position(namer: FrameNamer) -> tuple[str | None, str | None]:
    """``(where, inner)`` of the main thread now (see :meth:`FrameNamer.summary`)."""
    return namer.summary(main_thread_frames())


def start_stage(frames: list[tuple[str, int, str]], prepared: bool) -> str | None:
    """What a rank that has not stepped yet is doing: ``joining`` (``dmlctl.init()``
    joins the process group), ``importing`` (the main thread is inside an import),
    ``first step`` (``ctx.prepare`` has run: steps come next), else None (its own
    code: preparing data, say)."""
    if guards.is_joining():
        return "joining"
    if any(name.startswith("<frozen importlib") for name, _, _ in frames):
        return "importing"
    return "first step" if prepared else None


class Heartbeat:
    """Writes a beat every ``interval`` seconds (the first at once) until :meth:`stop`."""

    def __init__(
        self,
        writer: RankEventWriter,
        namer: FrameNamer,
        tracker: Tracker = TRACKER,
        interval: float = INTERVAL_S,
    ) -> None:
        self._writer = writer
        self._namer = namer
        self._tracker = tracker
        self._interval = interval
        self.last_coll: dict[str, list[Any]] | None = None  # the newest known counts
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dmlctl-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def beat(self) -> dict[str, Any]:
        """The current beat's fields."""
        out = self._tracker.snapshot()
        frames = main_thread_frames()
        where, inner = self._namer.summary(frames)
        if self._tracker.is_server:  # a parameter server never steps: it serves
            out["stage"] = STAGE_SERVING
        elif out.get("progress") == 0 and (stage := start_stage(frames, guards.is_prepared())):
            out["stage"] = stage
        if where is not None:
            out["where"] = where
        if inner is not None:
            out["inner"] = inner
        coll = collectives.snapshot()
        if coll:
            out["coll"] = self.last_coll = coll
        return out

    def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a beat that cannot be made is skipped
                self._writer.heartbeat(self.beat())
            if self._done.wait(self._interval):
                return

    def stop(self) -> None:
        """Stop beating (waits for a beat in progress)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(self._interval + 1.0)
