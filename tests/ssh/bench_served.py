"""``python -m tests.ssh.bench_served``: wall time of ``dmlctl launch`` of a 2-worker
job on two SSH hosts (the SSH test lab on this machine, one worker each), agents
started cold against agents forked by the hosts' agent servers, alternating, in the
same run; prints every launch and the ratio of the medians (the first launch on a
fresh lab is left out on both sides: it ships the code, and starts the servers)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.ssh.lab import start_lab
from tests.ssh.test_remote import cluster_file

JOB = Path(__file__).resolve().parents[1] / "integration" / "jobs" / "plain" / "job.yaml"
LAUNCHES = 4
SERVER_IMPORT_S = 8.0
"""How long the first launch's servers are given to import torch."""


def _launches(idle: float) -> list[float]:
    """Seconds of each launch after the first, on a fresh lab whose sessions have
    ``DMLCTL_AGENT_SERVER_IDLE=idle``."""
    root = Path(tempfile.mkdtemp(prefix="dmlctl-bench-served-"))
    with start_lab(root / "lab", agent_server_idle=idle) as lab:
        cluster = cluster_file(lab, root, **{h.alias: "slots: 1" for h in lab.hosts})
        env = lab.env(DMLCTL_HOME=str(root / "home"))
        argv = [sys.executable, "-m", "dmlctl", "launch", str(JOB), "--cluster", str(cluster)]
        times = []
        for i in range(LAUNCHES):
            start = time.monotonic()
            done = subprocess.run([*argv, "--ui", "quiet"], env=env, capture_output=True, text=True)
            times.append(time.monotonic() - start)
            if done.returncode != 0:
                raise SystemExit(f"launch failed: {done.stderr.strip()}")
            time.sleep(SERVER_IMPORT_S if i == 0 else 0.5)
    return times[1:]


def main() -> None:
    cold: list[float] = []
    served: list[float] = []
    for _ in range(2):
        cold += _launches(0.0)
        served += _launches(60.0)
    print("cold agents:   " + " ".join(f"{t:.2f}" for t in cold))
    print("agent servers: " + " ".join(f"{t:.2f}" for t in served))
    ratio = statistics.median(served) / statistics.median(cold)
    print(f"median launch with the hosts' agent servers / cold: {ratio:.2f}")


if __name__ == "__main__":
    main()
