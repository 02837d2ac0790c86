"""Getting remote hosts ready for a run, and collecting what they kept.

* :func:`package_files` / :func:`lib_id` — this dmlctl, shipped to every remote
  host next to the job (so hosts need Python and the packages the ranks import — see
  :mod:`dmlctl.provision.requirements` — not dmlctl);
* :func:`pick_port` — a free rendezvous port on the first host;
* :func:`sync_code` — the job directory and dmlctl to every remote host, in parallel;
* :func:`run_setup` — the job's ``setup`` command on every remote host, in
  parallel, output streamed into a per-host progress view;
* :func:`collect_rank_files` — each remote host's rank files into the local run
  directory (best effort: a host that is gone is reported, not fatal).
"""

from __future__ import annotations

import base64
import collections
import hashlib
import io
import tarfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

import dmlctl
from dmlctl.errors import DmlctlError
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.provision.sync import (
    LocalFile,
    SyncResult,
    SyncTarget,
    excludes_for,
    local_files,
    sync_all,
)
from dmlctl.runs.store import RunDir
from dmlctl.spec.models import JobSpec
from dmlctl.transport.base import Transport

SETUP_TAIL = 15


class ProvisionError(DmlctlError):
    """A host could not be made ready (sync or setup failed); names every host."""


def package_files() -> dict[str, LocalFile]:
    """The files of this dmlctl package, keyed ``dmlctl/...``."""
    root = Path(dmlctl.__file__).resolve().parent
    files = local_files(root, excludes_for(root, []))
    return {f"dmlctl/{rel}": f for rel, f in files.items()}


def lib_id(files: Mapping[str, LocalFile]) -> str:
    """A short id of the package content: hosts keep one copy per distinct content."""
    h = hashlib.sha256(dmlctl.__version__.encode())
    for rel in sorted(files):
        h.update(rel.encode())
        h.update(files[rel].path.read_bytes())
    return f"{dmlctl.__version__}-{h.hexdigest()[:12]}"


_FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def pick_port(transport: Transport, python: str, timeout: float) -> int:
    """A TCP port that was free on the host a moment ago."""
    res = transport.run([python, "-c", _FREE_PORT], timeout=timeout)
    if not res.ok or not res.stdout.strip().isdigit():
        raise ProvisionError(
            f"{transport.host}: cannot pick a rendezvous port: {res.stderr.strip()[-300:]}"
        )
    return int(res.stdout.strip())


def probe_host(host: HostPlan, transport: Transport, timeout: float = 10.0) -> str | None:
    """None when ``host`` answers a no-op command within ``timeout`` seconds, else
    why not (this machine always answers)."""
    if host.is_local:
        return None
    res = transport.run(["true"], timeout=timeout)
    return None if res.ok else (res.stderr.strip()[-200:] or f"exit code {res.exit_code}")


def rendezvous_on(host: HostPlan, transport: Transport, timeout: float = 10.0) -> str:
    """A rendezvous endpoint ``address:port`` on ``host``: its network address and a
    port free there a moment ago. Raises :class:`ProvisionError`."""
    from dmlctl.launch.api import free_port
    from dmlctl.transport import network_address

    if host.is_local:
        return f"127.0.0.1:{free_port()}"
    port = pick_port(transport, host.python, timeout)
    return f"{network_address(transport, host.address)}:{port}"


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
            why = res.stderr.strip()[-200:] or f"exit code {res.exit_code}"
            return f"{host.name}: could not check for agents left running: {why}"
        found = res.stdout.strip()
        return None if found in ("", "{}") else f"{host.name}: stopped agents left running {found}"

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return [p for p in pool.map(one, hosts) if p is not None]


def _describe(results: Sequence[SyncResult]) -> str:
    return "; ".join(f"{r.host}: {r.error}" for r in results if not r.ok)


def sync_code(
    plan: LaunchPlan, job: JobSpec, transports: Mapping[str, Transport], console: Console
) -> list[SyncResult]:
    """Ship the job directory and dmlctl to every remote host (spares too: they may
    replace a lost host); raise naming every
    host that failed. Returns the job sync result of every remote host."""
    remote = [h for h in (*plan.hosts, *plan.spares) if not h.is_local]
    if not remote:
        return []
    root = Path(job.workdir)
    code = local_files(root, excludes_for(root, job.exclude))
    pkg = package_files()
    with console.status(f"syncing {len(code)} files to {len(remote)} host(s)…"):
        results = sync_all(
            code, [SyncTarget(transports[h.name], h.python, h.workdir) for h in remote]
        )
        lib = sync_all(
            pkg,
            [SyncTarget(transports[h.name], h.python, h.agent_cwd or "") for h in remote],
        )
    failed = [r for r in (*results, *lib) if not r.ok]
    if failed:
        raise ProvisionError(f"code sync failed: {_describe(failed)}")
    for r in results:
        console.print(
            f"  {r.host}: {r.files_sent} of {r.files_total} files sent "
            f"({r.bytes_sent / 1024:.1f} KiB, {r.seconds:.1f} s)",
            markup=False, highlight=False,
        )  # fmt: skip
    return results


class _SetupView:
    """Per-host state of the setup step, rendered as a small table."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.lock = threading.Lock()
        self.last = dict.fromkeys(hosts, "starting…")
        self.state = dict.fromkeys(hosts, "running")
        self.tails = {h: collections.deque[str](maxlen=SETUP_TAIL) for h in hosts}
        self.started = time.monotonic()

    def render(self) -> Table:
        table = Table(box=None, title="setup", title_justify="left", show_header=False)
        with self.lock:
            for host, line in self.last.items():
                style = {"running": "yellow", "ok": "green", "failed": "bold red"}[
                    self.state[host]
                ]
                table.add_row(Text(host), Text(self.state[host], style=style),
                              Text(line[-100:], overflow="ellipsis", no_wrap=True))  # fmt: skip
        return table


def _setup_one(host: HostPlan, transport: Transport, command: str, view: _SetupView) -> int:
    try:
        proc = transport.start(["sh", "-c", f"{command} 2>&1"], cwd=host.workdir)
    except Exception as e:
        with view.lock:
            view.tails[host.name].append(str(e))
            view.state[host.name] = "failed"
        return 255
    proc.close_stdin()
    for line in proc.lines():
        with view.lock:
            view.last[host.name] = line
            view.tails[host.name].append(line)
    code = proc.wait(30.0)
    code = 255 if code is None else code
    with view.lock:
        view.state[host.name] = "ok" if code == 0 else "failed"
        if code != 0:
            view.tails[host.name].extend(proc.stderr_tail())
    return code


def run_setup(
    plan: LaunchPlan, job: JobSpec, transports: Mapping[str, Transport], console: Console
) -> None:
    """Run ``job.setup`` in the job directory of every remote host at once; raise
    naming each failing host with the tail of its output."""
    remote = [h for h in (*plan.hosts, *plan.spares) if not h.is_local]
    if job.setup is None or not remote:
        return
    view = _SetupView([h.name for h in remote])
    with Live(view.render(), console=console, refresh_per_second=4) as live, ThreadPoolExecutor(
        max_workers=min(32, len(remote))
    ) as pool:
        futures = {h.name: pool.submit(_setup_one, h, transports[h.name], job.setup, view)
                   for h in remote}  # fmt: skip
        while not all(f.done() for f in futures.values()):
            time.sleep(0.25)
            live.update(view.render())
        live.update(view.render())
    codes = {name: f.result() for name, f in futures.items()}
    failed = [name for name, code in codes.items() if code != 0]
    if failed:
        parts = []
        for name in failed:
            tail = "\n".join(f"    {line}" for line in view.tails[name])
            parts.append(f"setup failed on {name} (exit code {codes[name]}):\n{tail}")
        raise ProvisionError("\n".join(parts))


# Prints a base64 tar of argv[1] (a rank directory) on stdout.
_PACK = r"""
import base64, io, os, sys, tarfile
root = os.path.expanduser(sys.argv[1]); buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    if os.path.isdir(root):
        tar.add(root, arcname=".")
sys.stdout.write(base64.b64encode(buf.getvalue()).decode())
"""


def collect_rank_files(
    plan: LaunchPlan, transports: Mapping[str, Transport], run_dir: Path, timeout: float = 120.0
) -> list[str]:
    """Copy every remote host's rank directory into ``run_dir/hosts/<host>/``.

    Returns one problem line per host that could not be collected (nothing raised).
    """
    remote = [h for h in plan.hosts if not h.is_local]

    def fetch(host: HostPlan) -> str | None:
        res = transports[host.name].run([host.python, "-c", _PACK, host.rank_dir], timeout=timeout)
        if not res.ok:
            return f"{host.name}: {res.stderr.strip()[-300:] or f'exit code {res.exit_code}'}"
        dest = run_dir / "hosts" / host.name
        try:
            dest.mkdir(mode=0o700, parents=True, exist_ok=True)
            data = base64.b64decode(res.stdout)
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                tar.extractall(dest, filter="data")
        except (ValueError, tarfile.TarError, OSError) as e:
            return f"{host.name}: cannot unpack rank files: {e}"
        return None

    if not remote:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(remote))) as pool:
        return [p for p in pool.map(fetch, remote) if p is not None]


def fetch_rank_files(run: RunDir) -> list[str]:
    """:func:`collect_rank_files` for a finished run, from its ``plan.json``; local
    hosts' files are already in the run directory."""
    import json

    from dmlctl.transport import close_transports, make_transports

    plan = LaunchPlan.from_dict(json.loads(run.plan.read_text(encoding="utf-8")))
    transports = make_transports(h for h in plan.hosts if not h.is_local)
    try:
        return collect_rank_files(plan, transports, run.path)
    finally:
        close_transports(transports)
