"""Getting remote hosts ready for a run: code and setup.

* :func:`package_files` / :func:`lib_id` — this dmlctl, shipped to every remote
  host next to the job (so hosts need Python and the packages the ranks import — see
  :mod:`dmlctl.provision.requirements` — not dmlctl);
* :func:`sync_code` — the job directory and dmlctl to every remote host, in parallel;
* :func:`run_setup` — the job's ``setup`` command on every remote host, in
  parallel, output streamed into a per-host progress view.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.live import Live

import dmlctl
from dmlctl.errors import ProvisionError
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.provision.sync import (
    LocalFile,
    SyncResult,
    SyncTarget,
    excludes_for,
    local_files,
    sync_all,
)
from dmlctl.spec.models import JobSpec
from dmlctl.text import plural
from dmlctl.transport.base import Transport
from dmlctl.transport.fanout import MAX_THREADS
from dmlctl.ui.setup_view import SetupView


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
    with console.status(f"syncing {plural(len(code), 'file')} to {plural(len(remote), 'host')}…"):
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
            markup=False,
            highlight=False,
        )
    return results


def _setup_one(host: HostPlan, transport: Transport, command: str, view: SetupView) -> int:
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
    view = SetupView([h.name for h in remote])
    with (
        Live(view.render(), console=console, refresh_per_second=4) as live,
        ThreadPoolExecutor(max_workers=min(MAX_THREADS, len(remote))) as pool,
    ):
        futures = {
            h.name: pool.submit(_setup_one, h, transports[h.name], job.setup, view) for h in remote
        }
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
