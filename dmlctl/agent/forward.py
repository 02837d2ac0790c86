"""The ranks, as their host agent passes them on: every rank's output and records
read from the rank directory (:func:`emit_ranks`, :func:`drain`), each rank's process
sampled (:func:`rank_usage`) and its stacks dumped on request (:func:`dump`)."""

from __future__ import annotations

import contextlib
import json
import os

from dmlctl import protocol, wire
from dmlctl.agent.messages import Emitter
from dmlctl.agent.procs import descendants
from dmlctl.agent.stacks import dump_stacks, main_thread_frames, unarmed_ranks, unarmed_stacks
from dmlctl.agent.tail import RankDirTailer
from dmlctl.agent.usage import usage
from dmlctl.runtime.where import FrameNamer


class Held:
    """Exit records waiting for the rest of their rank's output (rank → records)."""

    def __init__(self) -> None:
        self.exits: dict[int, list[str]] = {}


def emit_ranks(
    tailer: RankDirTailer,
    emit: Emitter,
    pids: dict[int, int],
    final: bool = False,
    held: Held | None = None,
) -> bool:
    """Forward new rank output (noting each rank's pid in ``pids``); True if anything
    was read. A rank's ``exit`` record waits in ``held`` until its stdout and stderr
    have been read to their end, so its last lines (its traceback) come first."""
    records: list[str] = []
    any_data = False
    for rank, kind, lines in tailer.poll(final=final):
        any_data = True
        if kind == "events.jsonl":
            records += [rec for rec in lines if rec.strip()]
        else:
            emit.send(wire.LogMsg(rank, kind, tuple(lines)))
    held = held if held is not None else Held()
    for rank in [r for r in held.exits if r not in tailer.behind]:
        records += held.exits.pop(rank)
    for rec in records:
        record = protocol.record_kind(rec)
        exiting = _rank_of(rec) if record == protocol.KIND_EXIT else None
        if exiting is not None and exiting in tailer.behind:
            held.exits.setdefault(exiting, []).append(rec)
            continue
        if record == protocol.KIND_START:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                start = json.loads(rec)
                pids[int(start["rank"])] = int(start["pid"])
        emit.raw(wire.encode_rank_record(rec))
    return any_data


def _rank_of(record: str) -> int | None:
    try:
        return int(json.loads(record)["rank"])
    except (ValueError, KeyError, TypeError):
        return None


def drain(tailer: RankDirTailer, emit: Emitter, pids: dict[int, int], held: Held) -> None:
    """Forward everything the ranks wrote, to the end of every file."""
    while emit_ranks(tailer, emit, pids, held=held) or held.exits:
        pass
    emit_ranks(tailer, emit, pids, final=True, held=held)


def rank_usage(pids: dict[int, int]) -> dict[int, tuple[str, float, int]]:
    """Every rank's ``(state, CPU seconds, I/O bytes)`` (of its process tree), now."""
    out: dict[int, tuple[str, float, int]] = {}
    for rank, pid in pids.items():
        found = usage(pid)
        if found is not None:
            out[rank] = (found[0], round(found[1], 3), found[2])
    return out


def dump(pids: dict[int, int], rank_dir: str, namer: FrameNamer, emit: Emitter) -> None:
    """Every rank's stacks, each with where its main thread is, then ``dumped``. Only
    processes of this agent's own tree are signalled (a pid may have been reused)."""
    mine = set(descendants(os.getpid()))
    dumps, stopped = dump_stacks({r: p for r, p in pids.items() if p in mine}, rank_dir)
    for rank, pid in unarmed_ranks(mine, rank_dir, pids).items():
        dumps[rank] = unarmed_stacks(rank, pid)
    for rank, lines in sorted(dumps.items()):
        where, inner = namer.summary(main_thread_frames(lines))
        emit.send(wire.StacksMsg(rank, tuple(lines), where, inner))
    emit.send(wire.AgentMsg("dumped", stopped=tuple(stopped)))
