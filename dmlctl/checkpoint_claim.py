"""A checkpoint directory belongs to one run at a time: the run holds an exclusive
``flock`` on :data:`CLAIM_FILE` in it for its life, and the kernel lets go when the
holder dies, so a crashed run never leaves a stale claim.

Who holds it: the controller, for every directory on this machine (from before the
run's first rank starts to the run's end); each host agent, for its host's directory
(for that attempt; the agents of the same run take it in turn). A second run that
finds the claim held gets :class:`CheckpointInUse` naming the run that holds it,
also when both started in the same second: the lock decides, not a file's presence.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

from dmlctl.errors import UsageError
from dmlctl.private_files import file_in_the_way, make_private_dirs

CLAIM_FILE = ".dmlctl-claim"
"""The lock file in a checkpoint directory; it holds the id of the run that claims it."""

_OWNER_WAIT_S = 1.0
"""How long a loser waits for the winner to write its run id into the claim."""


class CheckpointInUse(UsageError):
    """The checkpoint directory is claimed by another run that is still going on."""

    def __init__(self, directory: str, owner: str) -> None:
        self.directory, self.owner = directory, owner
        who = f"run {owner}" if owner else "another run"
        super().__init__(
            f"checkpoint.dir {directory} is in use by {who}; wait for it to end, stop it "
            "(dmlctl stop), or give this job another checkpoint.dir (e.g. with {run_id})"
        )


def where(directory: str, workdir: str) -> str:
    """The directory the ranks use: ``~`` expanded, a relative one under ``workdir``
    (the ranks' working directory)."""
    return os.path.join(os.path.expanduser(workdir), os.path.expanduser(directory))


SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
               "/proc", "/sbin", "/sys", "/usr")  # fmt: skip
"""Where no run keeps checkpoints: the system's own files, devices and the kernel's
views (but :data:`SHARED_MEMORY`)."""

SHARED_MEMORY = "/dev/shm"
"""A memory filesystem under ``/dev`` where files may be kept (a fast checkpoint
directory that does not outlive the machine)."""


def system_dir(path: str) -> str | None:
    """The system directory (:data:`SYSTEM_DIRS`, or ``/`` itself) that the absolute
    ``path`` is or lies under, once ``..`` are resolved; None for any other."""
    normal = os.path.normpath(path)
    if normal == SHARED_MEMORY or normal.startswith(SHARED_MEMORY + "/"):
        return None
    if normal == "/":
        return "/"
    return next((d for d in SYSTEM_DIRS if normal == d or normal.startswith(d + "/")), None)


def unusable(directory: str) -> str | None:
    """Why ``directory`` (absolute, as :func:`where` gives it; the part before a
    ``{run_id}`` placeholder is looked at) cannot be a checkpoint directory on this
    machine: a system directory, or a file where a directory must be. None when it can."""
    path = os.path.normpath(directory.split("{", 1)[0])
    if (root := system_dir(path)) is not None:
        where = root if root == "/" else f"under {root}"
        return f"{os.path.normpath(directory)} is {where}: {SYSTEM_WHY}"
    return file_in_the_way(path)


SYSTEM_WHY = "the system keeps its files there; name a directory on a disk or a shared filesystem"


def _owner(fd: int) -> str:
    """The run id written in the claim, waiting a moment for a winner still writing it."""
    deadline = time.monotonic() + _OWNER_WAIT_S
    while True:
        owner = os.pread(fd, 256, 0).decode(errors="replace").strip()
        if owner or time.monotonic() > deadline:
            return owner
        time.sleep(0.02)


def claim(directory: str, run_id: str) -> int | None:
    """Claim ``directory`` (made, private, if missing) for ``run_id``: the open file
    descriptor holding the lock (keep it open for as long as the claim must hold), or
    None when this run holds it already (its controller, or an agent of it). Raises
    :class:`CheckpointInUse` when another run holds it, OSError when the directory
    cannot be made or the claim not opened."""
    make_private_dirs(directory)
    fd = os.open(os.path.join(directory, CLAIM_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _owner(fd)
        os.close(fd)
        if owner == run_id:
            return None
        raise CheckpointInUse(directory, owner) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, run_id.encode(), 0)
    return fd


def release(*fds: int | None) -> None:
    """Let go of claims (the kernel does as much when their holder dies)."""
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
