"""Checkpoints kept on the controller's machine, and handed to the hosts on a restart.

With host-local checkpoint directories (the default on remote hosts) each host holds
only its own ranks' files of a checkpoint. So that a checkpoint outlives its host:

* when a rank reports a committed checkpoint (:class:`CheckpointSaved`), the
  :class:`Replicator` copies that host's part of the step directory into
  ``<run>/checkpoints/`` in the background (newest first: a step superseded while
  queued is skipped). Once every rank's file is there and matches the manifest's
  size and sha256, the copy is committed (``step-…`` directory, then ``LATEST``)
  and the oldest copies beyond ``keep`` are removed;
* before a restart (or ``launch --resume``), :meth:`Replicator.hand_out` sends the
  newest complete copy to every host of the next attempt, only the files a host
  lacks (compared by sha256), committed there the same way. A host that takes over
  from a lost one so finds every rank's file, whatever ranks it gets.

The controller never imports torch: it moves files and checks their digests.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import tarfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dmlctl import protocol
from dmlctl.checkpoint_files import fsync_path, point_latest, sha256_file, step_dirs
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.transport.base import Transport
from dmlctl.transport.fanout import problems

# argv: root step_name → base64 tar.gz of the step directory's plain files (no dotfiles).
_PACK = r"""
import base64, io, os, sys, tarfile
d = os.path.join(os.path.expanduser(sys.argv[1]), sys.argv[2]); buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    for name in sorted(os.listdir(d)):
        if not name.startswith(".") and os.path.isfile(os.path.join(d, name)):
            tar.add(os.path.join(d, name), arcname=name)
sys.stdout.write(base64.b64encode(buf.getvalue()).decode())
"""

# argv: root step_name → JSON {file: sha256} of the files the host already has there.
_HAVE = r"""
import hashlib, json, os, sys
d = os.path.join(os.path.expanduser(sys.argv[1]), sys.argv[2]); out = {}
for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
    p = os.path.join(d, name)
    if not name.startswith(".") and os.path.isfile(p):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        out[name] = h.hexdigest()
print(json.dumps(out))
"""

# argv: root step_name; stdin: base64 tar.gz of missing files (with the manifest).
# Builds the complete step directory beside the old one, swaps it in, then moves
# LATEST forward (never back) — each step fsynced, as the runtime commits.
_UNPACK = r"""
import base64, io, os, re, shutil, sys, tarfile
root = os.path.expanduser(sys.argv[1]); name = sys.argv[2]
final = os.path.join(root, name); tmp = os.path.join(root, ".tmp-push-" + name)
os.makedirs(root, exist_ok=True); shutil.rmtree(tmp, ignore_errors=True)
if os.path.isdir(final):
    shutil.copytree(final, tmp)
else:
    os.makedirs(tmp)
with tarfile.open(fileobj=io.BytesIO(base64.b64decode(sys.stdin.buffer.read())), mode="r:gz") as t:
    t.extractall(tmp, filter="data")
for f in os.listdir(tmp):
    fd = os.open(os.path.join(tmp, f), os.O_RDONLY); os.fsync(fd); os.close(fd)
old = os.path.join(root, ".tmp-replaced-" + name)
if os.path.isdir(final):
    shutil.rmtree(old, ignore_errors=True); os.rename(final, old)
os.rename(tmp, final); shutil.rmtree(old, ignore_errors=True)
latest = os.path.join(root, "LATEST")
try:
    cur = open(latest).read().strip()
except OSError:
    cur = ""
num = lambda s: int(m.group(1)) if (m := re.match(r"^step-(\d+)$", s)) else -1
if num(name) >= num(cur):
    with open(latest + ".push", "w") as f:
        f.write(name); f.flush(); os.fsync(f.fileno())
    os.replace(latest + ".push", latest)
fd = os.open(root, os.O_RDONLY); os.fsync(fd); os.close(fd)
"""


def checkpoint_root(host: HostPlan) -> str | None:
    """The checkpoint directory of ``host``'s ranks (None: the job saves none)."""
    return host.env.get(protocol.ENV_CHECKPOINT_DIR)


def _tar(files: Mapping[str, Path]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, path in sorted(files.items()):
            tar.add(path, arcname=name)
    return base64.b64encode(buf.getvalue())


class Replicator:
    """The controller's copy of a run's checkpoints (see the module docstring).

    ``hosts`` maps host names to their plans (a resized attempt may add hosts:
    :meth:`track` them); ``on_copied(step)`` is called from a worker thread when
    checkpoint ``step`` is complete here. Thread-safe.
    """

    def __init__(
        self,
        root: Path,
        transports: Mapping[str, Transport],
        hosts: Sequence[HostPlan],
        *,
        keep: int = 3,
        timeout: float = 300.0,
        on_copied: Callable[[int], None] = lambda _step: None,
    ) -> None:
        self.root = root
        self.transports = transports
        self.keep = keep
        self.timeout = timeout
        self.on_copied = on_copied
        self._hosts: dict[str, HostPlan] = {h.name: h for h in hosts}
        self._lock = threading.Lock()
        self._wanted: dict[str, int] = {}  # host → newest step reported, not yet fetched
        self._busy: set[str] = set()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ckpt-copy")
        self.problems: list[str] = []

    def track(self, hosts: Sequence[HostPlan]) -> None:
        """Know these hosts' plans too (the hosts of a resized attempt)."""
        with self._lock:
            self._hosts.update({h.name: h for h in hosts})

    # -- from the hosts to the controller -------------------------------------------

    def saved(self, host: str, step: int) -> None:
        """Host ``host`` committed checkpoint ``step``: copy its part, in the background."""
        with self._lock:
            if step <= self._wanted.get(host, -1) or host not in self._hosts:
                return
            self._wanted[host] = step
            if host in self._busy:
                return  # the running copy picks the newest step up when it ends
            self._busy.add(host)
        self._pool.submit(self._copy_loop, host)

    def _copy_loop(self, host: str) -> None:
        while True:
            with self._lock:
                step = self._wanted.pop(host, None)
                if step is None:
                    self._busy.discard(host)
                    return
                plan = self._hosts[host]
            try:
                self._copy(plan, step)
            except Exception as e:  # a copy failure must never stop the run
                with self._lock:
                    self.problems.append(f"{host}: checkpoint step {step}: {e}")

    def _copy(self, host: HostPlan, step: int) -> None:
        root = checkpoint_root(host)
        if root is None:
            return
        name = protocol.checkpoint_step_dir(step)
        res = self.transports[host.name].run(
            [host.python, "-c", _PACK, root, name], timeout=self.timeout
        )
        if not res.ok:
            raise RuntimeError(res.why())
        incoming = self.root / f".in-{host.name}-{step}"
        shutil.rmtree(incoming, ignore_errors=True)
        # Inside the run directory only: a deleted run directory is never made again.
        self.root.mkdir(mode=0o700, exist_ok=True)
        incoming.mkdir()
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(res.stdout)), mode="r:gz") as tar:
            tar.extractall(incoming, filter="data")
        part = self.root / f".tmp-step-{step}"
        with self._lock:  # hosts' parts meet here one at a time
            part.mkdir(exist_ok=True)
            for f in incoming.iterdir():
                os.replace(f, part / f.name)
            shutil.rmtree(incoming, ignore_errors=True)
        self._commit_if_complete(step, part)

    def _commit_if_complete(self, step: int, part: Path) -> None:
        """Commit ``part`` as checkpoint ``step`` once it holds every rank's file."""
        with self._lock:
            final = self.root / protocol.checkpoint_step_dir(step)
            if final.is_dir() or not part.is_dir() or not _complete(part):
                return
            for f in part.iterdir():
                fsync_path(f)
            os.rename(part, final)
            fsync_path(self.root)
            if step_dirs(self.root)[0][0] == step:  # LATEST never moves back
                point_latest(self.root, final.name)
            self._prune_locked()
        self.on_copied(step)

    def _prune_locked(self) -> None:
        steps = step_dirs(self.root)
        for _, path in steps[self.keep :]:
            shutil.rmtree(path, ignore_errors=True)
        if steps:
            kept = steps[min(len(steps), self.keep) - 1][0]
            for p in self.root.glob(".tmp-step-*"):
                num = p.name.removeprefix(".tmp-step-")
                if num.isdigit() and int(num) < kept:
                    shutil.rmtree(p, ignore_errors=True)  # parts that can no longer matter

    def newest(self) -> tuple[int, Path] | None:
        """``(step, directory)`` of the newest complete copy here, or None."""
        with self._lock:
            steps = step_dirs(self.root)
        return steps[0] if steps else None

    def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the copies under way to end."""
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        try:
            while not deadline.wait(0.05):
                with self._lock:
                    if not self._busy:
                        return
        finally:
            timer.cancel()

    def close(self) -> None:
        """Stop taking copies; a copy under way ends on its own (bounded by ``timeout``)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- from the controller to the hosts --------------------------------------------

    def hand_out(self, hosts: Sequence[HostPlan]) -> list[str]:
        """Give every host in ``hosts`` the newest complete checkpoint held here (only
        the files it lacks); returns one problem line per host that could not take it
        (the run goes on: such a host resumes from what it has)."""
        newest = self.newest()
        if newest is None:
            return []
        step, directory = newest
        files = {p.name: p for p in directory.iterdir() if p.is_file()}
        digests = {name: sha256_file(p) for name, p in files.items()}

        def push(host: HostPlan) -> str | None:
            root = checkpoint_root(host)
            if root is None:
                return None
            transport = self.transports[host.name]
            have = transport.run(
                [host.python, "-c", _HAVE, root, directory.name], timeout=self.timeout
            )
            try:
                present = json.loads(have.stdout) if have.ok else {}
            except ValueError:
                present = {}
            missing = {n: p for n, p in files.items() if present.get(n) != digests[n]}
            if not missing:
                return None
            missing[protocol.CHECKPOINT_MANIFEST] = files[protocol.CHECKPOINT_MANIFEST]
            res = transport.run(
                [host.python, "-c", _UNPACK, root, directory.name],
                timeout=self.timeout,
                input=_tar(missing),
            )
            if not res.ok:
                why = res.why()
                return f"{host.name}: cannot hand checkpoint step {step} over: {why}"
            return None

        return problems(hosts, push)


def _complete(part: Path) -> bool:
    """Whether ``part`` holds the manifest and every file it lists, digests matching
    (files are hashed only once all of them are there with their sizes)."""
    try:
        manifest = json.loads((part / protocol.CHECKPOINT_MANIFEST).read_text())
        files = {name: dict(entry) for name, entry in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    paths = {name: part / name for name in files}
    if not all(p.is_file() and p.stat().st_size == files[n].get("size") for n, p in paths.items()):
        return False
    return all(sha256_file(p) == files[n].get("sha256") for n, p in paths.items())


def replicated(plan: LaunchPlan) -> bool:
    """Whether ``plan`` needs the controller's copy: the job saves checkpoints, some
    host is remote, and the directory is dmlctl's per-host one (a ``checkpoint.dir``
    the user names is taken to be shared by the hosts)."""
    spec = plan.checkpoint
    return spec is not None and spec.dir is None and any(not h.is_local for h in plan.hosts)
