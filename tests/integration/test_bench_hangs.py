"""``dmlctl bench hangs`` stopped by Ctrl-C (a real bench, a real run): the whole bench
ends — not just the run under way — with exit 130 and the results it has, marked
partial; before it starts it says how many runs it plans and about how long."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import Cli
from tests.integration.procs import run_processes, wait_until

pytestmark = pytest.mark.integration


def test_ctrl_c_ends_the_whole_bench_with_its_partial_results(cli: Cli) -> None:
    argv = [sys.executable, "-m", "dmlctl", "bench", "hangs", "--runs", "1"]
    argv += ["--scenarios", "prep,eval", "--seconds", "60", "--skew", "0", "--no-burn", "--json"]
    proc = subprocess.Popen(
        argv,
        env=cli.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        assert proc.stderr is not None
        said: list[str] = []
        for line in proc.stderr:  # until the first run has an id (quiet: said first)
            said.append(line)
            if line.startswith("run "):
                break
        assert said and said[0].startswith("dmlctl bench hangs: 2 runs (2 scenarios × 1)"), said
        run_id = said[-1].split()[1]
        assert wait_until(lambda: len(run_processes(run_id)) >= 4, 60), said  # 2 ranks up
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        out, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = "".join(said) + rest
    assert proc.returncode == 130, err
    assert f"run {run_id} stopped" in err and "interrupted (Ctrl-C)" in err, err
    assert "eval 1/1" not in err, err  # the bench did not go on to the next run
    assert "partial results: interrupted after 0 of 2 runs" in err, err
    assert json.loads(out)["partial"] == "interrupted after 0 of 2 runs"
