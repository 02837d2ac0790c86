"""Ranks forked from the warm torchrun (:mod:`dmlctl.agent.forked_rank`): when a rank
may be forked, and what the forked process is (real forks of this test process, each
running a tiny script through the runtime entry; torch is never imported)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dmlctl.agent import forked_rank
from dmlctl.agent.forked_rank import ENTRY, ForkedRank, can_fork

PY = sys.executable


def _argv(script: str = "train.py") -> tuple[str, ...]:
    return (PY, *ENTRY, script)


def _env(**changes: str) -> dict[str, str]:
    return {**forked_rank.STARTUP_ENV, "RANK": "0", **changes}


# ------------------------------------------------------------------------- can_fork


def test_the_runtime_entry_with_the_agents_environment_is_forked() -> None:
    assert can_fork(_argv(), _env(TORCHELASTIC_RUN_ID="x", TORCH_NCCL_ASYNC_ERROR_HANDLING="1"))
    assert can_fork(_argv(), _env(OMP_NUM_THREADS="3", PYTHONPATH="/somewhere"))


@pytest.mark.parametrize(
    "argv",
    [
        (PY, "-u", "train.py"),  # not the runtime entry
        ("/usr/bin/numactl", "--cpunodebind=0", PY, *ENTRY, "train.py"),  # torchrun's NUMA binding
        ("/opt/other/python3", *ENTRY, "train.py"),  # another interpreter
        (PY, *ENTRY),  # no script
    ],
)
def test_any_other_command_starts_as_a_new_process(argv: tuple[str, ...]) -> None:
    assert not can_fork(argv, _env())


@pytest.mark.parametrize(
    "changes",
    [
        {"TORCH_LOGS": "+dynamo"},  # read when torch is imported
        {"LD_PRELOAD": "/lib/libjemalloc.so"},
        {"PYTHONHASHSEED": "0"},
        {"OMP_PROC_BIND": "close"},
        {"OMP_NUM_THREADS": "two"},  # a value only a new libgomp can judge
        {"PYTHONPATH": "/a::/b"},  # an empty entry means the directory Python starts in
    ],
)
def test_what_python_or_torch_read_at_start_keeps_a_new_process(changes: dict[str, str]) -> None:
    assert not can_fork(_argv(), _env(**changes))


def test_sys_path_takes_the_ranks_pythonpath_in_place_of_the_agents(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(forked_rank.STARTUP_ENV, "PYTHONPATH", "/agent/extra")
    monkeypatch.setattr(sys, "path", ["/script/dir", "/agent/extra", "/stdlib", "/site"])
    path = forked_rank._sys_path(os.pathsep.join(["/shipped/dmlctl", "/user/lib", "/site"]))
    assert path == ["/script/dir", "/shipped/dmlctl", "/user/lib", "/site", "/stdlib"]


# ------------------------------------------------------------------ a forked process

PROBE = """\
import json, os, signal, sys
print(json.dumps({
    "argv": sys.argv, "file": __file__, "name": __name__,
    "session": os.getsid(0) == os.getpid(),
    "env": os.environ.get("PROBE"),
    "fds": sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if int(fd) > 2 and os.path.exists(f"/proc/self/fd/{fd}")),
    "term": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "int": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "unbuffered": sys.stdout.write_through,
}))
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture
def held_socket() -> Iterator[socket.socket]:
    """A listening socket of the forking process (torchrun's rendezvous store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s


def _fork(tmp_path: Path, source: str, **env: str) -> tuple[ForkedRank, Path]:
    script = tmp_path / "probe.py"
    script.write_text(source)
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        rank = ForkedRank(_argv(str(script)), _env(**env), f, f)
    return rank, out


@pytest.fixture
def torchrun_handlers() -> Iterator[None]:
    """SIGTERM and SIGINT caught by the forking process, as torchrun catches them."""
    old = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in old.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("torchrun_handlers")
def test_a_forked_rank_runs_the_script_as_a_new_interpreter_would(
    tmp_path: Path, held_socket: socket.socket
) -> None:
    rank, out = _fork(tmp_path, PROBE, PROBE="seen", PROBE_EXIT="3")
    assert rank.wait(30) == 3 and rank.poll() == 3 and rank.returncode == 3
    seen = json.loads(out.read_text().splitlines()[-1])
    assert seen["argv"] == [str(tmp_path / "probe.py")]
    assert (seen["file"], seen["name"]) == (str(tmp_path / "probe.py"), "__main__")
    assert seen["env"] == "seen" and seen["session"] and seen["unbuffered"]
    assert seen["term"] and seen["int"]  # torchrun's handlers are gone
    # Nothing of the forking process stays open: no socket, no pipe.
    assert all(fd == os.devnull for fd in seen["fds"]), seen["fds"]


def test_a_forked_rank_is_waited_for_and_signalled_like_a_popen(tmp_path: Path) -> None:
    rank, _ = _fork(tmp_path, "import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        rank.wait(0.2)
    assert rank.poll() is None
    os.killpg(rank.pid, signal.SIGTERM)  # what torchrun does to stop a rank
    assert rank.wait(30) == -signal.SIGTERM
    rank.kill()  # already gone: nothing to signal


def test_a_fork_that_cannot_use_the_gpus_executes_a_new_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forked_rank, "_cuda_unusable", lambda: "CUDA was initialised")
    rank, out = _fork(tmp_path, PROBE, PROBE="exec")
    assert rank.wait(60) == 0
    lines = out.read_text().splitlines()
    assert "dmlctl: CUDA was initialised in torchrun: rank 0 starts as a new interpreter" in lines
    seen = json.loads(lines[-1])
    assert seen["env"] == "exec" and seen["session"]
