"""What decides whether a launch asks a host's agent server: the idle setting, the
socket directory (this user's alone), the key a server must share with the
starter, which commands qualify, and how a remote host's agent is started (through
its starter, whose end stops the agent)."""

from __future__ import annotations

import fcntl
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dmlctl.agent import ask
from dmlctl.agent.ask import (
    IDLE_S,
    eligible,
    idle_seconds,
    runtime_dir,
    server_key,
)
from dmlctl.agent.messages import Commands
from dmlctl.agent_config import AgentRequest
from dmlctl.transport.agent_server import served


@pytest.fixture
def short() -> Iterator[Path]:
    """A directory short enough to hold sockets (a test's own tmp_path may not be)."""
    path = Path(tempfile.mkdtemp(prefix="dmlctl-test-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize(
    ("value", "expected"), [(None, IDLE_S), ("0", 0.0), ("2.5", 2.5), ("soon", IDLE_S)]
)
def test_idle_seconds(value: str | None, expected: float) -> None:
    env = {} if value is None else {"DMLCTL_AGENT_SERVER_IDLE": value}
    assert idle_seconds(env) == expected


def test_the_socket_directory_is_made_for_this_user_alone(short: Path) -> None:
    made = runtime_dir({"XDG_RUNTIME_DIR": str(short)})
    assert made == short / "dmlctl"
    assert made.stat().st_mode & 0o777 == 0o700


def test_a_socket_directory_others_can_enter_is_not_used(short: Path) -> None:
    (short / "dmlctl").mkdir(mode=0o755)
    os.chmod(short / "dmlctl", 0o755)
    assert runtime_dir({"XDG_RUNTIME_DIR": str(short)}) is None


def test_without_a_runtime_directory_the_temp_directory_holds_one_per_user(
    short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(short))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert runtime_dir({}) == short / f"dmlctl-{os.getuid()}"


def test_a_runtime_directory_too_long_for_a_socket_gives_way_to_the_temporary_one(
    short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(short))
    monkeypatch.setattr(tempfile, "tempdir", None)
    deep = short / ("d" * 80)
    assert runtime_dir({"XDG_RUNTIME_DIR": str(deep)}) == short / f"dmlctl-{os.getuid()}"


def test_the_key_follows_what_python_and_torch_read_at_start_and_nothing_else() -> None:
    base = {"PATH": "/usr/bin", "DMLCTL_HOME": "/a"}
    key = server_key(sys.executable, base)
    assert server_key(sys.executable, {**base, "DMLCTL_HOME": "/b", "PATH": "/bin"}) == key
    assert server_key(sys.executable, {**base, "OMP_NUM_THREADS": "3"}) == key  # applied later
    assert server_key(sys.executable, {**base, "TORCH_LOGS": "+dynamo"}) != key
    assert server_key(sys.executable, {**base, "PYTHONHASHSEED": "1"}) != key
    assert server_key(sys.executable, {**base, "LD_PRELOAD": "x.so"}) != key
    assert server_key(sys.executable, {**base, "PYTHONPATH": "/elsewhere"}) != key
    assert server_key(sys.executable, {**base, "TMPDIR": "/scratch"}) != key
    assert server_key("/usr/bin/python3-elsewhere", base) != key


def test_only_this_interpreters_host_agent_qualifies() -> None:
    agent = [sys.executable, "-m", "dmlctl.agent", "--run-id", "r"]
    assert eligible(agent, {})
    assert eligible(agent, {"PYTHONPATH": "/a:/b"})
    assert not eligible(agent, {"PYTHONPATH": "rel:/b"})  # found from the server's cwd
    assert not eligible(agent, {"PYTHONPATH": "/a::/b"})  # empty: the working directory
    assert not eligible(["/usr/bin/python3-elsewhere", *agent[1:]], {})
    assert not eligible([sys.executable, "-m", "dmlctl.agent.standin"], {})
    assert not eligible([sys.executable, "-c", "pass"], {})


def test_the_key_follows_the_limits_a_process_inherits(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent forked by a server has the server's cgroup, affinity and limits: a
    controller with other ones (``ulimit -l`` raised for RDMA) gets a server of its own."""
    key = server_key(sys.executable, {})
    real = resource.getrlimit

    def raised(which: int) -> tuple[int, int]:
        soft, hard = real(which)
        return (soft - 1, hard) if which == resource.RLIMIT_MEMLOCK else (soft, hard)

    monkeypatch.setattr(resource, "getrlimit", raised)
    assert server_key(sys.executable, {}) != key


def test_a_remote_host_starts_its_agent_through_the_served_starter() -> None:
    agent = ["/venv/bin/python", "-m", "dmlctl.agent", "--run-id", "r1"]
    assert served(agent) == ["/venv/bin/python", "-m", "dmlctl.agent.served", "--run-id", "r1"]
    other = ["/venv/bin/python", "-c", "print(1)"]
    assert served(other) == other


@pytest.mark.parametrize("starter", [None, 4242])
def test_a_request_names_its_starter(starter: int | None) -> None:
    sent = AgentRequest(("py", "-m", "dmlctl.agent"), "/w", {"A": "1"}, 0o022, starter)
    assert AgentRequest.from_json(sent.to_json()) == sent


def test_the_end_of_the_starter_means_the_controller_is_gone() -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()
    gone = Commands(threading.Event(), [], None, starter=ended.pid)
    assert gone.controller_gone()
    here = Commands(threading.Event(), [], None, starter=os.getpid())
    assert not here.controller_gone()
    assert not Commands(threading.Event(), [], None).controller_gone()


class _StartingServer:
    """What :func:`dmlctl.agent.ask._start_server` starts, in a thread: it takes the
    lock at once, "imports" for ``delay`` seconds, then listens (``listens=False``:
    ends without, as a server whose import failed) and accepts two connections."""

    def __init__(self, delay: float, listens: bool = True) -> None:
        self.delay, self.listens, self.started = delay, listens, 0
        self.threads: list[threading.Thread] = []

    def __call__(self, _py: str, sock: Path, lock: Path, _idle: float, _env: object) -> bool:
        self.started += 1
        ready = threading.Event()
        thread = threading.Thread(target=self._serve, args=(sock, lock, ready), daemon=True)
        thread.start()
        ready.wait(5)
        self.threads.append(thread)
        return True

    def _serve(self, sock: Path, lock: Path, ready: threading.Event) -> None:
        with open(lock, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            ready.set()
            time.sleep(self.delay)
            if not self.listens:
                return
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
                listener.bind(str(sock))
                listener.listen(2)
                for _ in range(2):
                    conn, _ = listener.accept()
                    conn.close()


def _agent_env(short: Path) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-m", "dmlctl.agent", "--run-id", "r"], {
        "XDG_RUNTIME_DIR": str(short),
        "DMLCTL_AGENT_SERVER_IDLE": "60",
    }


def test_the_first_starter_waits_for_the_server_it_starts(
    short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No server yet: one is started and the starter waits for it (its import serves
    this agent too), telling ``waiting`` meanwhile; a second starter meanwhile waits
    for the same one instead of starting another."""
    server = _StartingServer(delay=0.6)
    monkeypatch.setattr(ask, "_start_server", server)
    argv, env = _agent_env(short)
    beats: list[float] = []
    other: list[socket.socket | None] = []

    def second() -> None:
        time.sleep(0.2)  # once the first has started the server
        other.append(ask.connect(argv, env))

    later = threading.Thread(target=second)
    later.start()
    began = time.monotonic()
    first = ask.connect(argv, env, lambda: beats.append(time.monotonic()))
    later.join(10)
    assert first is not None and time.monotonic() - began >= 0.6
    assert beats and server.started == 1
    assert other and other[0] is not None  # the same server, not a second one
    first.close()
    other[0].close()


def test_a_server_that_ends_without_listening_leaves_the_start_to_the_starter(
    short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server started ends without listening (its import failed): after its lock
    is free for ``LOCK_GRACE_S`` the starter gets None and starts its agent itself."""
    server = _StartingServer(delay=0.2, listens=False)
    monkeypatch.setattr(ask, "_start_server", server)
    monkeypatch.setattr(ask, "LOCK_GRACE_S", 0.5)
    argv, env = _agent_env(short)
    began = time.monotonic()
    assert ask.connect(argv, env) is None
    assert server.started == 1 and time.monotonic() - began < 5
