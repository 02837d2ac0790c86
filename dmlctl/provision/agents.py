"""Host agents an earlier controller of a run left running, found and stopped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dmlctl.plan.model import HostPlan
from dmlctl.transport.base import Transport
from dmlctl.transport.fanout import problems

# argv: run_id rank_dir → stops (SIGTERM, then SIGKILL after 5 s) every host agent of
# this run whose agent.pid is in rank_dir or an attempt-* directory below it and whose
# command line names the run; prints what it found as JSON {pid: "stopped"|"killed"}.
_STOP_STALE = r"""
import glob, json, os, signal, sys, time
run_id = sys.argv[1]; root = os.path.expanduser(sys.argv[2]); found = {}
def alive(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return run_id.encode() in f.read()
    except OSError:
        return False
pids = [os.path.join(root, "agent.pid"), *glob.glob(os.path.join(root, "attempt-*", "agent.pid"))]
for path in pids:
    try:
        pid = int(open(path).read().strip())
    except (OSError, ValueError):
        continue
    if pid != os.getpid() and alive(pid):
        os.kill(pid, signal.SIGTERM); found[pid] = "stopped"
end = time.monotonic() + 5
while any(alive(p) for p in found) and time.monotonic() < end:
    time.sleep(0.1)
for pid in found:
    if alive(pid):
        os.kill(pid, signal.SIGKILL); found[pid] = "killed"
print(json.dumps(found))
"""


def stop_stale_agents(
    run_id: str, hosts: Sequence[HostPlan], transports: Mapping[str, Transport]
) -> list[str]:
    """Stop the host agents an earlier controller of run ``run_id`` left running
    (a host that was cut off keeps its agent until its connection times out): every
    agent whose ``agent.pid`` lies in a host's rank directories and whose command line
    names the run gets SIGTERM (it stops its ranks), SIGKILL after 5 s. Returns one
    line per host that had any, or could not be checked (nothing raised)."""

    def one(host: HostPlan) -> str | None:
        res = transports[host.name].run(
            [host.python, "-c", _STOP_STALE, run_id, host.rank_dir], timeout=30.0
        )
        if not res.ok:
            why = res.why(200)
            return f"{host.name}: could not check for agents left running: {why}"
        found = res.stdout.strip()
        return None if found in ("", "{}") else f"{host.name}: stopped agents left running {found}"

    return problems(hosts, one)
