"""The zygote of ``ranks.start: warm`` (:mod:`dmlctl.agent.zygote`): forked from a
process with one thread, it forks ranks that run their script with torch imported,
refuses (and the requester starts a new interpreter) where a fork cannot give what a
new interpreter would, tells each child's exit code, and kills the children of a
requester that went away."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from dmlctl.agent import zygote, zygote_client

pytestmark = [pytest.mark.integration, pytest.mark.compat]
ENTRY = [sys.executable, "-u", "-m", "dmlctl.runtime.entry"]

# Runs in a new interpreter with one thread: forks a zygote, asks it for ranks.
DRIVER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from dmlctl.agent import zygote
    from dmlctl.agent.zygote_client import RANK, Client

    script, out = sys.argv[1], sys.argv[2]
    conn = zygote.start()
    client = Client(conn)
    entry = [sys.executable, "-u", "-m", "dmlctl.runtime.entry", script]
    env = {**os.environ, "RANK": "0", "OMP_NUM_THREADS": "1"}
    first = client.fork(RANK, [*entry, out, "0"], env, os.getcwd(), (1, 2))
    bad = client.fork(RANK, [*entry, out, "1"], {**env, "LD_PRELOAD": "x"}, ".", (1, 2))
    sleeper = client.fork(RANK, [*entry, out, "sleep"], env, os.getcwd(), (1, 2))
    codes = {}
    deadline = time.monotonic() + 60
    while first not in codes and time.monotonic() < deadline:
        code = client.exit_code(first)
        if code is not None:
            codes[first] = code
        time.sleep(0.02)
    os.killpg(sleeper, signal.SIGTERM)
    while client.exit_code(sleeper) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    print(json.dumps({"first": first, "code": codes.get(first), "bad": bad,
                      "sleeper": client.exit_code(sleeper)}))
    """
)

RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    out, name = sys.argv[1], sys.argv[2]
    if name == "sleep":
        time.sleep(60)
    import torch
    seen = {"torch": "torch" in sys.modules, "threads": torch.get_num_threads(),
            "argv": sys.argv, "ppid": os.getppid(), "sid": os.getsid(0) == os.getpid(),
            "rank": os.environ.get("RANK")}
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(seen, f)
    sys.exit(3)
    """
)


def test_a_rank_forked_by_the_zygote_runs_its_script_and_its_end_is_told(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = subprocess.run(
        [sys.executable, str(driver), str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    told = json.loads(proc.stdout.splitlines()[-1])
    assert told["code"] == 3 and isinstance(told["first"], int)
    assert told["sleeper"] == -15  # signalled as a process group: its own session
    assert "LD_PRELOAD differ" in told["bad"]  # refused: read at start
    seen = json.loads((tmp_path / "0.json").read_text())
    assert seen["torch"] and seen["threads"] == 1 and seen["sid"] and seen["rank"] == "0"
    assert seen["argv"] == [str(script), str(tmp_path), "0"]
    assert not (tmp_path / "1.json").exists()


def test_the_zygote_is_never_forked_from_a_process_with_threads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert zygote.start() is None
    finally:
        stop.set()
        thread.join()
    assert "threads: ranks start fresh" in capsys.readouterr().err


def test_the_zygote_refuses_to_fork_while_it_has_a_second_thread() -> None:
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        served = zygote.Zygote(theirs)
        argv = [sys.executable, "-m", "dmlctl.agent.torchrun"]
        request = zygote.Request(zygote_client.TORCHRUN, argv, dict(zygote.STARTUP_ENV), ".")
        reply = served._fork(ours, request, [])
    finally:
        stop.set()
        thread.join()
        ours.close()
        theirs.close()
    assert "threads" in str(reply.get("refused")), reply


@pytest.mark.parametrize(
    ("argv", "env", "why"),
    [
        (["python3", "train.py"], {}, "not dmlctl's entry"),
        ([*ENTRY, "t.py"], {"OMP_NUM_THREADS": "two"}, "not a number"),
        ([*ENTRY, "t.py"], {"PYTHONPATH": ":/x"}, "empty entry"),
        ([*ENTRY, "t.py"], {"TORCH_LOGS": "+dynamo"}, "TORCH_LOGS differ"),
        (["/usr/bin/python3.9", "-u", "-m", "dmlctl.runtime.entry", "t.py"], {}, "interpreter"),
    ],
)
def test_what_a_fork_cannot_give_keeps_a_new_interpreter(
    argv: list[str], env: dict[str, str], why: str
) -> None:
    base = {k: v for k, v in zygote.STARTUP_ENV.items()}
    reason = zygote.can_fork(argv, {**base, **env})
    assert reason is not None and why in reason


def test_the_runtime_entry_with_the_zygotes_environment_is_forked() -> None:
    assert zygote.can_fork([*ENTRY, "train.py", "--lr", "1"], dict(zygote.STARTUP_ENV)) is None


@pytest.mark.parametrize(
    ("argv", "env", "why"),
    [
        (["python3", "train.py"], {}, "not a module"),
        ([sys.executable, "-m", "dmlctl.agent.torchrun"], {"TORCH_LOGS": "+dynamo"}, "TORCH_LOGS"),
        (["/usr/bin/python3.9", "-m", "dmlctl.agent.torchrun"], {}, "interpreter"),
        (["no-such-python", "-m", "dmlctl.agent.torchrun"], {}, "interpreter"),
    ],
)
def test_torchrun_is_forked_only_with_the_interpreter_and_start_it_was_imported_with(
    argv: list[str], env: dict[str, str], why: str
) -> None:
    reason = zygote.can_fork_torchrun(argv, {**zygote.STARTUP_ENV, **env})
    assert reason is not None and why in reason


def test_torchrun_of_this_virtual_environment_is_forked(tmp_path: Path) -> None:
    """A venv's ``python`` links to the base interpreter: the same file as another
    venv's, so the environment is what is compared."""
    assert zygote.can_fork_torchrun([sys.executable, "-m", "m"], dict(zygote.STARTUP_ENV)) is None
    other = tmp_path / "venv"
    (other / "bin").mkdir(parents=True)
    (other / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (other / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    reason = zygote.can_fork_torchrun([str(other / "bin" / "python"), "-m", "m"], {})
    assert reason is not None and "interpreter" in reason
