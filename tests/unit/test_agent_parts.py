"""Pieces of the host agent: the rank-file tailer (pure file I/O) and the process-tree
killer (on a tiny real ``sh`` + ``sleep`` tree, never on anything else)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

import dmlctl.agent.__main__ as agent_main
from dmlctl.agent.forward import Held
from dmlctl.agent.messages import Commands, Emitter
from dmlctl.agent.procs import descendants, kill_tree
from dmlctl.agent.stacks import dump_stacks, main_thread_frames, process_state
from dmlctl.agent.tail import CHUNK, MAX_LINE, RankDirTailer
from dmlctl.agent_config import AgentConfig

# ---------------------------------------------------------------------------- tailer


@pytest.fixture
def tailer(tmp_path: Path) -> Iterator[RankDirTailer]:
    t = RankDirTailer(str(tmp_path))
    yield t
    t.close()


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def poll(t: RankDirTailer, final: bool = False) -> list[tuple[int, str, list[str]]]:
    return list(t.poll(final=final))


def test_partial_line_is_held_back_until_completed(tmp_path: Path, tailer: RankDirTailer) -> None:
    out = tmp_path / "rank-0.stdout"
    append(out, b"first\nsec")
    assert poll(tailer) == [(0, "stdout", ["first"])]
    assert poll(tailer) == []  # "sec" is not a line yet
    append(out, b"ond\nthi")
    assert poll(tailer) == [(0, "stdout", ["second"])]
    assert poll(tailer, final=True) == [(0, "stdout", ["thi"])]
    assert poll(tailer, final=True) == []  # flushed once


def test_final_flushes_a_last_line_without_newline(tmp_path: Path, tailer: RankDirTailer) -> None:
    append(tmp_path / "rank-2.stderr", b"Traceback (most recent call last):\nValueError: x")
    assert poll(tailer, final=True) == [
        (2, "stderr", ["Traceback (most recent call last):", "ValueError: x"])
    ]


def test_files_appearing_later_are_picked_up_from_their_start(tmp_path: Path) -> None:
    rank_dir = tmp_path / "not-yet"
    t = RankDirTailer(str(rank_dir))
    try:
        assert poll(t) == []  # the directory does not exist yet
        rank_dir.mkdir()
        append(rank_dir / "rank-0.stdout", b"zero\n")
        assert poll(t) == [(0, "stdout", ["zero"])]
        append(rank_dir / "rank-1.events.jsonl", b'{"kind":"start"}\n')
        append(rank_dir / "rank-1.stdout", b"one\n")
        append(rank_dir / "notes.txt", b"not a rank file\n")
        append(rank_dir / "rank-x.stdout", b"not a rank file either\n")
        assert sorted(poll(t)) == [
            (1, "events.jsonl", ['{"kind":"start"}']),
            (1, "stdout", ["one"]),
        ]
    finally:
        t.close()


def test_crlf_and_invalid_utf8_are_tolerated(tmp_path: Path, tailer: RankDirTailer) -> None:
    append(tmp_path / "rank-0.stdout", b"windows\r\nbad \xff byte\n")
    assert poll(tailer) == [(0, "stdout", ["windows", "bad \ufffd byte"])]


def test_utf8_split_across_writes_is_decoded_whole(tmp_path: Path, tailer: RankDirTailer) -> None:
    out = tmp_path / "rank-0.stdout"
    text = "loss ↓ 0.5\n".encode()
    cut = text.index("↓".encode()) + 1  # in the middle of the arrow's bytes
    append(out, text[:cut])
    assert poll(tailer) == []
    append(out, text[cut:])
    assert poll(tailer) == [(0, "stdout", ["loss ↓ 0.5"])]


def test_100k_lines_are_all_returned_exactly_once_in_order(
    tmp_path: Path, tailer: RankDirTailer
) -> None:
    n = 100_000
    out = tmp_path / "rank-3.stdout"
    lines = [f"step {i:06d} loss {i * 0.001:.3f}" for i in range(n)]
    payload = "".join(line + "\n" for line in lines).encode()
    assert len(payload) > 2 * CHUNK  # one poll reads at most about CHUNK per file
    got: list[str] = []
    # Written in odd-sized pieces, polled between writes: lines straddle the pieces.
    piece = 65_537
    for start in range(0, len(payload), piece):
        append(out, payload[start : start + piece])
        for rank, kind, batch in poll(tailer):
            assert (rank, kind) == (3, "stdout")
            got += batch
    for _ in range(10):  # drain what is left after the last write
        for _, _, batch in poll(tailer):
            got += batch
    got += [line for _, _, batch in poll(tailer, final=True) for line in batch]
    assert len(got) == n
    assert got == lines


def test_one_poll_reads_a_bounded_amount(tmp_path: Path, tailer: RankDirTailer) -> None:
    line = b"x" * 99 + b"\n"
    append(tmp_path / "rank-0.stdout", line * (3 * CHUNK // len(line)))
    first = poll(tailer)
    assert len(first) == 1
    assert 0 < len(first[0][2]) <= CHUNK // len(line) + 1
    total = len(first[0][2])
    while batch := poll(tailer):
        total += len(batch[0][2])
    assert total == 3 * CHUNK // len(line)


# ----------------------------------------------------------------------------- procs


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


Starter = Callable[[str], "subprocess.Popen[bytes]"]


@pytest.fixture
def tree() -> Iterator[Starter]:
    """Starts ``sh -c SCRIPT`` in a session of its own and waits for its two children."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(script: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
        procs.append(proc)
        assert wait_for(lambda: len(descendants(proc.pid)) == 2), descendants(proc.pid)
        return proc

    yield start
    for proc in procs:  # never leave anything behind, whatever the test did
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_descendants_lists_parents_before_children(tree: Starter) -> None:
    sh = tree("sleep 30 & sleep 30 & wait")
    mine = descendants(os.getpid())
    assert sh.pid in mine
    kids = descendants(sh.pid)
    assert len(kids) == 2 and sh.pid not in kids
    assert all(mine.index(sh.pid) < mine.index(k) for k in kids)

    def program() -> bytes:
        with open(f"/proc/{kids[0]}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0]

    # The child sh forked is sh until it has exec'd sleep (a moment on a loaded machine).
    assert wait_for(lambda: program().endswith(b"sleep")), program()


def test_kill_tree_ends_every_descendant(tree: Starter) -> None:
    sh = tree("sleep 30 & sleep 30 & wait")
    kids = descendants(sh.pid)
    t0 = time.monotonic()
    kill_tree(sh.pid, grace=2.0)
    assert time.monotonic() - t0 < 2.0  # SIGTERM was enough: no wait for the grace
    assert descendants(sh.pid) == []
    assert not any(alive(k) for k in kids)
    # With its children gone, sh's `wait` returns and sh exits by itself.
    assert sh.wait(2.0) == 0


def test_kill_tree_sigkills_what_ignores_sigterm(tree: Starter) -> None:
    # `trap "" TERM` makes sh ignore SIGTERM, and the sleeps inherit the ignored signal.
    sh = tree('trap "" TERM; sleep 30 & sleep 30 & wait')
    kids = descendants(sh.pid)
    t0 = time.monotonic()
    kill_tree(sh.pid, grace=0.3)
    took = time.monotonic() - t0
    assert descendants(sh.pid) == []
    assert not any(alive(k) for k in kids)
    assert 0.3 <= took < 2.5
    sh.wait(2.0)


@pytest.mark.parametrize("rank_runs", [False, True])
def test_a_stop_waits_the_ranks_grace_only_while_a_rank_runs(
    tmp_path: Path, tailer: RankDirTailer, monkeypatch: pytest.MonkeyPatch, rank_runs: bool
) -> None:
    """torchrun in its store's exit barrier does not end on SIGTERM (it is blocked in
    C++); with no rank process left the agent ends it after ``NO_RANK_GRACE_S``, not
    after the ranks' grace (which a running rank gets in full)."""
    torchrun = subprocess.Popen(
        ["sh", "-c", 'trap "" TERM; sleep 30 & wait'], start_new_session=True
    )
    assert wait_for(lambda: len(descendants(torchrun.pid)) == 1)  # its trap is set
    rank = subprocess.Popen(["sleep", "30" if rank_runs else "0"])
    if not rank_runs:
        rank.wait()  # exited and reaped, as torchrun reaps its ranks

    def kill(_root: int, _grace: float, keep: frozenset[int] = frozenset()) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(torchrun.pid, signal.SIGKILL)  # only this test's processes
        rank.kill()

    monkeypatch.setattr(agent_main, "kill_tree", kill)
    commands = Commands(threading.Event(), ["stop requested"], os.getppid())
    commands.stop.set()
    out = io.StringIO()
    config = cast(AgentConfig, SimpleNamespace(stop_grace=1.5, workdir=str(tmp_path)))
    began = time.monotonic()
    pids = {0: rank.pid}
    args = (config, tailer, Emitter(out, threading.Event()), commands, pids, str(tmp_path), Held())
    try:
        assert agent_main._supervise(torchrun, *args)  # type: ignore[arg-type]  # bytes
    finally:
        kill(0, 0.0)  # never leave them behind, whatever the agent did
    took = time.monotonic() - began
    rank.wait(5)
    if rank_runs:
        assert took >= 1.5 and "stopping (ranks get 1.5 s)" in out.getvalue(), out.getvalue()
    else:
        assert took < 1.5 and "stopping (no rank runs)" in out.getvalue(), out.getvalue()


def test_a_final_poll_flushes_a_last_line_only_at_the_end_of_the_file(
    tmp_path: Path, tailer: RankDirTailer
) -> None:
    line = b"y" * 99 + b"\n"
    append(tmp_path / "rank-0.stdout", line * (2 * CHUNK // len(line)) + b"no newline")
    got: list[str] = []
    while batch := poll(tailer, final=True):  # the agent's drain: poll until nothing
        got += batch[0][2]
    assert len(got) == 2 * CHUNK // len(line) + 1
    assert got[-1] == "no newline" and all(g == "y" * 99 for g in got[:-1])


def test_a_line_longer_than_the_limit_is_passed_on_in_pieces(
    tmp_path: Path, tailer: RankDirTailer
) -> None:
    append(tmp_path / "rank-0.stdout", b"z" * (MAX_LINE + CHUNK) + b"\nend\n")
    got: list[str] = []
    for _ in range(2 + (MAX_LINE + CHUNK) // CHUNK):  # a poll reads one CHUNK at most
        for _, _, lines in poll(tailer):
            got += lines
    assert "".join(got) == "z" * (MAX_LINE + CHUNK) + "end"  # nothing lost
    assert got[-1] == "end" and all(len(g) <= MAX_LINE + CHUNK for g in got)


# ----------------------------------------------------------------------------- stacks

DUMPER = """
import faulthandler, signal, sys, threading, time
f = open(sys.argv[1], "ab", buffering=0)
f.write(b"dmlctl: rank 0 pid 1 main thread 0x%016x\\n" % threading.main_thread().ident)
faulthandler.register(signal.SIGUSR2, file=f, all_threads=True)
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
def blocked_here():
    print("ready", flush=True)
    time.sleep(60)
blocked_here()
"""


def test_every_rank_dumps_its_stacks_on_request_and_a_stopped_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without py-spy (a fresh venv has none): the stopped rank is named, not read.
    monkeypatch.setattr("dmlctl.agent.stacks.shutil.which", lambda _name: None)
    procs = []
    try:
        for rank in (0, 1):
            path = tmp_path / f"rank-{rank}.stacks"
            p = subprocess.Popen([sys.executable, "-c", DUMPER, str(path)], stdout=subprocess.PIPE)
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            procs.append(p)
        os.kill(procs[1].pid, signal.SIGSTOP)
        assert wait_for(lambda: process_state(procs[1].pid) == "T")
        dumps, stopped = dump_stacks({0: procs[0].pid, 1: procs[1].pid}, str(tmp_path))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert stopped == [1]
    assert "is stopped (state T" in dumps[1][0]
    assert dumps[0][0].startswith("dmlctl: rank 0 pid 1 main thread 0x")
    frames = main_thread_frames(dumps[0])
    assert [f[2] for f in frames[:2]] == ["blocked_here", "<module>"]
    assert sum(line.startswith(("Thread 0x", "Current thread 0x")) for line in dumps[0]) == 2


def test_a_py_spy_dump_is_read_like_a_faulthandler_one() -> None:
    dump = [
        "Process 4242: python train.py",
        "Python v3.11.7 (/usr/bin/python3.11)",
        "",
        'Thread 4250 (idle): "dmlctl-heartbeat"',
        "    wait (threading.py:331)",
        'Thread 4242 (idle): "MainThread"',
        "    wait_for_batch (/job/train.py:64)",
        "    main (/job/train.py:94)",
    ]
    assert main_thread_frames(dump) == [
        ("/job/train.py", 64, "wait_for_batch"),
        ("/job/train.py", 94, "main"),
    ]


def test_a_records_kind_is_read_from_its_head_not_from_a_logged_value(tmp_path: Path) -> None:
    from dmlctl import protocol

    writer = protocol.RankEventWriter(str(tmp_path), 3)
    writer.start(0, "worker", "local")
    writer.metric(5, {"kind": "exit", "note": '"kind":"start"'})  # what a script may log
    writer.exit(0, None)
    writer.close()
    lines = Path(protocol.rank_events(str(tmp_path), 3)).read_text().splitlines()
    assert [protocol.record_kind(line) for line in lines] == ["start", "metric", "exit"]
    assert protocol.record_kind("not a record") is None
    assert protocol.record_kind('{"kind":"tru') is None


def test_a_process_shows_the_command_line_it_is_given_when_it_has_room() -> None:
    """``set_cmdline``: what ``ps`` shows, within the room of the process's own command
    line (a forked agent writes its own over its server's); longer: left as it was."""
    code = (
        "import sys\n"
        "from dmlctl.agent.procs import set_cmdline\n"
        "print(set_cmdline(['python', '-m', 'dmlctl.agent', '--run-id', 'r1']))\n"
        "print(set_cmdline(['x' * 500]))\n"
        "print(open('/proc/self/cmdline', 'rb').read().rstrip(b'\\0').decode())\n"
    )
    room = " " * 100
    out = subprocess.run(
        [sys.executable, "-c", code, room], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["True", "False", "python\0-m\0dmlctl.agent\0--run-id\0r1"]
