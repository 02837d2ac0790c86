"""Where a spec key is: the file and line of a :class:`~dmlctl.errors.PlanError`.

The planner is pure and works on validated specs, which carry no positions; when it
refuses a job it names the spec (job or cluster) and the key path at fault. This
module turns that into the same ``file:line key: message`` issue the loader gives,
by looking the key up in the file again (positions only; nothing is re-validated).
"""

from __future__ import annotations

from collections.abc import Collection

from dmlctl.errors import DmlctlError, PlanError, SpecError, SpecIssue, UsageError
from dmlctl.spec.hostfile import is_hostfile
from dmlctl.spec.messages import format_path
from dmlctl.spec.source import read_text
from dmlctl.spec.yamlpos import KeyPath, YamlSyntaxError, parse


def locate(
    error: PlanError,
    job_file: str | None,
    cluster_file: str | None,
    flags: Collection[str] = (),
) -> DmlctlError:
    """``error`` as a :class:`SpecError` naming ``file:line key`` of the spec it is
    about; as a :class:`UsageError` naming the flag when the key was set by one
    (``flags``: job keys given on the command line, e.g. ``workers`` for
    ``--workers``) or when the key conflicts with one a flag set
    (``error.involves``), or with no file when that spec has none (the default
    cluster)."""
    key = error.path[0] if error.path else None
    if error.spec == "job" and isinstance(key, str) and key in flags:
        return UsageError(f"--{key}: {error.message}")
    file = job_file if error.spec == "job" else cluster_file
    if file is None:
        where = "this machine (the default cluster)" if error.spec == "cluster" else "the job"
        return UsageError(f"{where}: {error.message}")
    line = line_of(file, error.path)
    flag = next((k for k in error.involves if k in flags), None) if error.spec == "job" else None
    if flag is not None:  # the file's key conflicts with what the flag set
        at = f"{file}:{line}" if line is not None else file
        return UsageError(f"--{flag}: {error.message} ({format_path(error.path)} at {at})")
    issue = SpecIssue(file, line, format_path(error.path), error.message)
    return SpecError([issue])


def line_of(file: str, path: KeyPath) -> int | None:
    """The 1-based line of ``path`` in the job, cluster or hostfile ``file`` (of its
    nearest ancestor that has one), or None when the file cannot be read."""
    try:
        text = read_text(file, "a spec file")
    except SpecError:
        return None
    if is_hostfile(file, text):
        return _hostfile_line(text, path)
    try:
        return parse(text).line_of(path)
    except YamlSyntaxError:
        return None


def _hostfile_line(text: str, path: KeyPath) -> int | None:
    """Line of host ``path[1]`` of a hostfile (``("hosts", index, ...)``)."""
    index = path[1] if len(path) > 1 and path[0] == "hosts" else 0
    seen = -1
    for number, line in enumerate(text.split("\n"), start=1):
        if line.split("#", 1)[0].strip():
            seen += 1
            if seen == index:
                return number
    return None
