"""Code sync: a local directory to a directory on every host, in parallel, incremental.

For each host: ask the host for a manifest of what it has (relative path → size and
modification time), compare with the local files (minus excludes and ``.gitignore``),
and send only new or changed files as one tar stream over the transport, unpacked
by a small receiver script with the host's Python. Unchanged files are never sent
again; files are never deleted on the host (outputs such as checkpoints may live
there). Every host's result is returned, failures included.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec

from dmlctl.transport.base import Transport
from dmlctl.transport.fanout import on_every

BUILTIN_EXCLUDES = (
    ".git/",
    "__pycache__/",
    "*.pyc",
    ".venv/",
    ".dmlctl/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    "*.egg-info/",
)

# Prints {relative path: [size, mtime_ns]} of every file under argv[1] (missing: {}).
MANIFEST = r"""
import json, os, sys
root = os.path.expanduser(sys.argv[1]); out = {}
for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if x != ".dmlctl"]
    for f in files:
        p = os.path.join(d, f)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        out[os.path.relpath(p, root).replace(os.sep, "/")] = [st.st_size, st.st_mtime_ns]
print(json.dumps(out))
"""

# Unpacks a tar from stdin into argv[1], refusing paths that leave it. Each file is
# written beside its place and renamed onto it: hosts sharing a filesystem (a Slurm
# cluster's home) may receive the same files at once, and a reader never sees half.
RECEIVER = r"""
import os, shutil, socket, sys, tarfile
root = os.path.realpath(os.path.expanduser(sys.argv[1])); os.makedirs(root, exist_ok=True)
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
    for m in tar:
        dest = os.path.realpath(os.path.join(root, m.name))
        if not (m.isfile() or m.isdir()) or not dest.startswith(root + os.sep):
            sys.exit("refusing tar member %r" % m.name)
        if m.isdir():
            os.makedirs(dest, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        part = "%s.%s-%d.part" % (dest, socket.gethostname(), os.getpid())
        with tar.extractfile(m) as src, open(part, "wb") as out:
            shutil.copyfileobj(src, out)
        os.chmod(part, m.mode & 0o777)
        os.utime(part, (int(m.mtime), int(m.mtime)))
        os.replace(part, dest)
print("ok")
"""


@dataclass(frozen=True)
class LocalFile:
    path: Path
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class SyncResult:
    """What one host got: ``error`` is None on success."""

    host: str
    files_sent: int
    bytes_sent: int
    files_total: int
    seconds: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def excludes_for(root: Path, extra: Sequence[str]) -> pathspec.GitIgnoreSpec:
    """Built-in excludes + ``extra`` + the root's ``.gitignore`` (gitignore syntax)."""
    lines = [*BUILTIN_EXCLUDES, *extra]
    gitignore = root / ".gitignore"
    if gitignore.is_file():
        lines += gitignore.read_text(encoding="utf-8", errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def local_files(root: Path, spec: pathspec.GitIgnoreSpec) -> dict[str, LocalFile]:
    """Regular files under ``root`` not matched by ``spec`` (symlinks followed to files)."""
    out: dict[str, LocalFile] = {}
    for d, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(d, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        dirs[:] = sorted(x for x in dirs if not spec.match_file(rel_dir + x + "/"))
        for name in sorted(files):
            rel = rel_dir + name
            if spec.match_file(rel):
                continue
            path = Path(d) / name
            try:
                st = path.stat()
            except OSError:
                continue
            if path.is_file():
                out[rel] = LocalFile(path, st.st_size, st.st_mtime_ns)
    return out


NS = 1_000_000_000


def changed(local: Mapping[str, LocalFile], remote: Mapping[str, Sequence[int]]) -> list[str]:
    """Relative paths to send: new, or different in size or in modification time at
    whole-second resolution (as rsync compares; files are sent with whole-second
    times, so the comparison is exact on every filesystem). A same-size edit within
    the same second as the previous sync is not seen; touch the file to force it."""
    out = []
    for rel, f in local.items():
        have = remote.get(rel)
        if have is None or have[0] != f.size or have[1] // NS != f.mtime_ns // NS:
            out.append(rel)
    return out


def make_tar(local: Mapping[str, LocalFile], paths: Iterable[str]) -> bytes:
    """An uncompressed tar of ``paths`` with their modes and modification times."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in paths:
            f = local[rel]
            info = tar.gettarinfo(str(f.path), arcname=rel)
            info.mtime = f.mtime_ns // NS
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(f.path, "rb") as fh:
                tar.addfile(info, fh)
    return buf.getvalue()


def sync_host(
    transport: Transport,
    python: str,
    files: Mapping[str, LocalFile],
    remote_dir: str,
    *,
    timeout: float = 600.0,
) -> SyncResult:
    """Bring ``remote_dir`` on one host up to date with ``files``."""
    start = time.monotonic()
    host = transport.host

    def fail(msg: str) -> SyncResult:
        return SyncResult(host, 0, 0, len(files), time.monotonic() - start, msg)

    listing = transport.run([python, "-c", MANIFEST, remote_dir], timeout=timeout)
    if not listing.ok:
        return fail(listing.stderr.strip() or f"listing {remote_dir} failed ({listing.exit_code})")
    try:
        remote = json.loads(listing.stdout)
    except ValueError:
        return fail(f"unexpected answer listing {remote_dir}: {listing.stdout[:200]!r}")
    todo = changed(files, remote)
    if not todo:
        return SyncResult(host, 0, 0, len(files), time.monotonic() - start)
    data = make_tar(files, todo)
    put = transport.run([python, "-c", RECEIVER, remote_dir], timeout=timeout, input=data)
    if not put.ok:
        return fail(put.stderr.strip()[-500:] or f"unpacking failed ({put.exit_code})")
    return SyncResult(host, len(todo), len(data), len(files), time.monotonic() - start)


@dataclass(frozen=True)
class SyncTarget:
    """One host's part of a sync: its transport, interpreter and destination."""

    transport: Transport
    python: str
    remote_dir: str


def sync_all(
    files: Mapping[str, LocalFile], targets: Sequence[SyncTarget], *, timeout: float = 600.0
) -> list[SyncResult]:
    """:func:`sync_host` on every target at once; one result per target, in order."""

    def one(t: SyncTarget) -> SyncResult:
        return sync_host(t.transport, t.python, files, t.remote_dir, timeout=timeout)

    return on_every(targets, one)
