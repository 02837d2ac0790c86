"""One checkpoint directory on disk, as one rank sees it (no collectives): writing a
file synced, the commit lock, committing a step directory (manifest, rename,
``LATEST``, pruning), the candidates to resume from, verifying a rank's file against
its manifest and loading it safely — and the errors all of that raises.

The layout is :mod:`dmlctl.runtime.checkpoint`'s (its docstring states the
guarantees); :class:`~dmlctl.runtime.checkpoint.CheckpointManager` runs the
collective protocol over these steps.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from dmlctl.checkpoint_files import fsync_path, point_latest, sha256_file, step_dirs, step_of
from dmlctl.failure import FULL_DISK_ERRNOS
from dmlctl.private_files import PRIVATE_FILE, make_private_dirs, private_opener
from dmlctl.protocol import CHECKPOINT_LATEST, CHECKPOINT_MANIFEST, DELETED_WHILE_RUNNING, rank_file

_UNSAFE = "Unsupported global"  # torch's weights-only unpickler met code to run


def disk_full(exc: BaseException) -> OSError | None:
    """The "no space left" error behind ``exc`` (torch.save wraps it in a RuntimeError)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in FULL_DISK_ERRNOS:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _first_line(exc: BaseException) -> str:
    """What went wrong, in one line (torch's weights-only error names it after a long
    advice to load unsafely, which never applies here)."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:200] if lines else "no detail"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or used."""


class CheckpointRefused(CheckpointError):
    """A checkpoint file needs unsafe unpickling (``weights_only=False``); refused."""


class CheckpointCorrupt(CheckpointError):
    """Checkpoints exist but none of them can be loaded (and no fresh start is allowed)."""


class CheckpointForeign(CheckpointError):
    """The newest checkpoint was written by another run (and no warm start is asked)."""


class DiskFull(CheckpointError):
    """A checkpoint could not be written: no space (or quota) left on its device."""


class Unloadable(Exception):
    """A checkpoint file that passed its checksum but cannot be loaded."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (corrupt, partial, other world size)."""


def take_lock(path: Path) -> bool:
    """Create ``path`` exclusively: True for the one caller that created it."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE))
    except (FileExistsError, FileNotFoundError):  # taken, or already committed
        return False
    return True


def make_root_once(root: Path, seen: bool) -> None:
    """Make checkpoint directory ``root`` (with its parents) when it was never
    ``seen``; one that was seen and is gone raises ``FileNotFoundError`` instead of
    coming back (deleted while the run runs, with the run directory)."""
    if not seen:
        make_private_dirs(str(root))
    elif not root.is_dir():
        raise FileNotFoundError(
            f"the checkpoint directory {root} {DELETED_WHILE_RUNNING}; it is not made again"
        )


def write_synced(path: Path, data: bytes | dict[str, Any]) -> None:
    with open(path, "wb", opener=private_opener) as f:
        if isinstance(data, bytes):
            f.write(data)
        else:
            torch.save(data, f)
        f.flush()
        os.fsync(f.fileno())


def commit(
    root: Path,
    step: int,
    tmp: Path,
    final: Path,
    world_size: int,
    keep: int,
    files: dict[str, Any],
    sharded: bool = False,
    run_id: str | None = None,
) -> None:
    """Commit ``tmp`` as checkpoint ``final`` of ``step``: write the manifest of every
    file (``files``: name → size and sha256; every rank's file, and with ``sharded``
    the shards of a ``torch.distributed.checkpoint`` that every rank needs), rename
    the directory into place, point ``LATEST`` at it, and prune (newer steps of an
    abandoned timeline, all but the ``keep`` newest, leftover temporary directories).
    The manifest records ``run_id``, the run that wrote it (see :func:`saved_by`)."""
    manifest = {
        "format": 1,
        "step": step,
        "world_size": world_size,
        "time": time.time(),
        "files": files,
        "sharded": sharded,
        **({"run_id": run_id} if run_id else {}),
    }
    write_synced(tmp / CHECKPOINT_MANIFEST, json.dumps(manifest, indent=1).encode())
    fsync_path(tmp)
    if final.exists():  # a discarded timeline's checkpoint of the same step
        old = root / f".tmp-replaced-{step}"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_path(root)
    point_latest(root, final.name)
    # Prune: newer steps belong to a timeline abandoned by a resume; then the oldest.
    older = [p for s, p in step_dirs(root) if s < step]
    doomed = [p for s, p in step_dirs(root) if s > step] + older[keep - 1 :]
    doomed += [p for p in root.glob(".tmp-*") if p.is_dir()]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)


def candidates(root: Path) -> list[tuple[int, Path]]:
    """The step directories to try, newest first: LATEST's target first, then older
    ones; every committed-looking one when LATEST is unusable (missing, unreadable,
    not text, naming no step directory)."""
    dirs = step_dirs(root)
    try:
        name = (root / CHECKPOINT_LATEST).read_bytes().decode("utf-8").strip()
    except (OSError, ValueError):
        return dirs
    head = step_of(name)
    if head is None or not (root / name).is_dir():
        return dirs
    return [(head, root / name)] + [(s, p) for s, p in dirs if s < head]


def saved_world(path: Path, default: int) -> int:
    """How many ranks saved checkpoint ``path`` (``default`` if unreadable)."""
    try:
        return max(1, int(json.loads((path / CHECKPOINT_MANIFEST).read_text())["world_size"]))
    except (OSError, ValueError, KeyError, TypeError):
        return default


def saved_by(path: Path) -> str | None:
    """The id of the run that wrote checkpoint ``path`` (None when its manifest does
    not say: written by an older dmlctl, or unreadable)."""
    try:
        run_id = json.loads((path / CHECKPOINT_MANIFEST).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return run_id if isinstance(run_id, str) and run_id else None


def verify(path: Path, step: int, rank: int) -> str | None:
    """Why checkpoint ``path`` of ``step`` is unusable for ``rank``, or None when its
    file (``rank mod`` the saved world size) — and for a sharded checkpoint every
    file — matches the manifest."""
    try:
        manifest = json.loads((path / CHECKPOINT_MANIFEST).read_text())
        saved = int(manifest["world_size"])
        fname = rank_file(rank % max(saved, 1))
        entry = dict(manifest["files"][fname])
        if int(manifest["step"]) != step:
            return "manifest names another step"
    except FileNotFoundError:
        return "no manifest"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"unreadable manifest ({type(exc).__name__}: {exc})"
    needed = {fname: entry}
    if manifest.get("sharded"):  # every rank reads from every shard file
        needed = {name: dict(e) for name, e in manifest["files"].items()}
    for name, want in needed.items():
        file = path / name
        size = file.stat().st_size if file.is_file() else None
        if size != want.get("size"):
            return f"size mismatch on {name} (truncated/missing: {size} bytes)"
        if sha256_file(file) != want.get("sha256"):
            return f"checksum mismatch on {name}"
    return None


def refusal(file: Path, error: str) -> str:
    """The one-line message for ``file``, which torch's weights-only unpickler refused
    with ``error``: the global it would have had to import and call, and what to save
    instead (never torch's advice to turn safe loading off)."""
    found = re.search(r"GLOBAL ([\w.]+)", error)
    what = repr(found.group(1)) if found else "code"
    return (
        f"{file} needs unsafe unpickling (refused): it would import and call {what}; "
        "save only tensors and plain types (model.state_dict(), optimizer.state_dict())"
    )


def load_rank_file(path: Path, rank: int, world_size: int) -> dict[str, Any]:
    """Rank ``rank``'s state in checkpoint ``path`` (the file of ``rank mod`` the saved
    world size, with a warning when that differs from ``world_size``), unpickled with
    ``weights_only=True``. Raises :class:`CheckpointRefused` for a file that needs
    more, :class:`Unloadable` for one that cannot be loaded or holds no dict."""
    saved = saved_world(path, world_size)
    file = path / rank_file(rank % saved)
    if saved != world_size:
        msg = (
            f"checkpoint {path.name} was saved by {saved} ranks; rank {rank} of "
            f"{world_size} resumes from {file.name}"
        )
        warnings.warn(msg, CheckpointWarning, stacklevel=3)
        print(f"dmlctl rank {rank}: {msg}", file=sys.stderr, flush=True)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if _UNSAFE in str(exc):  # it asks to run code: refused, never a fallback
            raise CheckpointRefused(refusal(file, str(exc))) from exc
        raise Unloadable(f"{type(exc).__name__}: {_first_line(exc)}") from exc
    except Exception as exc:  # a damaged file whose manifest was written to match
        raise Unloadable(f"{type(exc).__name__}: {_first_line(exc)}") from exc
    if not isinstance(state, dict):
        raise Unloadable(f"it holds a {type(state).__name__}, not a dict")
    return state
