"""The paths of a job file checked against the disk: its workdir is a directory, its
script and its ``parallelize: FILE:FUNCTION`` file are regular files inside it (links
resolved), the function exists. Every problem becomes an issue with file:line."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlctl.errors import SpecIssue
from dmlctl.spec.fields import check_one_line, shown
from dmlctl.spec.parallelism import missing_function, split_parallelize
from dmlctl.spec.source import path_kind
from dmlctl.spec.yamlpos import Document


def is_one_line(value: str) -> bool:
    """Whether ``value`` is a usable one-line string (no control characters)."""
    try:
        check_one_line(value)
    except ValueError:
        return False
    return True


def check_paths(
    file: str, doc: Document, job_dir: Path, data: Mapping[str, Any], issues: list[SpecIssue]
) -> tuple[Path | None, str | None]:
    """Absolute workdir and script relative to it; problems appended to ``issues``.

    The script, and the file of ``parallelize: FILE:FUNCTION``, must be regular files
    inside the workdir (:func:`_file_inside`).
    """
    workdir = _workdir(file, doc, job_dir, data, issues)
    if workdir is None:
        return None, None
    script = _file_inside(file, doc, workdir, "script", data.get("script"), issues)
    target = _parallelize_target(data.get("parallelize"))
    if target is not None:
        found = _file_inside(file, doc, workdir, "parallelize", target[0], issues)
        why = None if found is None else missing_function(workdir / found, target[1])
        if why is not None:
            issues.append(SpecIssue(file, doc.line_of(("parallelize",)), "parallelize", why))
    return workdir, script


def _workdir(
    file: str, doc: Document, job_dir: Path, data: Mapping[str, Any], issues: list[SpecIssue]
) -> Path | None:
    """The job's workdir, absolute, when it is a directory; else None (problems
    appended to ``issues``, or left to the model)."""
    raw_workdir = data.get("workdir", ".")
    if not isinstance(raw_workdir, str) or not is_one_line(raw_workdir):
        return None  # the model reports it
    # os.path, not Path: Path.expanduser/resolve/is_dir raise for '~nobody', symlink
    # loops or over-long names, and any file content must end as an issue.
    workdir = Path(os.path.realpath(job_dir / os.path.expanduser(raw_workdir)))
    line = doc.line_of(("workdir",))
    if not is_one_line(str(workdir)):
        issues.append(
            SpecIssue(
                file,
                line,
                "workdir",
                f"resolves to an unusable path "
                f"(control characters in it): {shown(str(workdir), 120)}",
            )
        )
        return None
    kind = path_kind(workdir)
    if kind != "directory":
        what = "no such directory" if kind == "missing" else "not a directory"
        issues.append(SpecIssue(file, line, "workdir", f"{what}: {shown(str(workdir), 120)}"))
        return None
    return workdir


def _file_inside(
    file: str, doc: Document, workdir: Path, key: str, raw: Any, issues: list[SpecIssue]
) -> str | None:
    """``raw`` (the path of job key ``key``) relative to ``workdir``, as a POSIX path,
    when it is a regular file inside ``workdir`` once symbolic links are resolved (a
    link pointing out of the workdir would ship and run something else); else None,
    the problem appended to ``issues`` (or left to the model when ``raw`` is no
    usable string)."""
    if not isinstance(raw, str) or not is_one_line(raw):
        return None
    line = doc.line_of((key,))
    candidate = Path(os.path.normpath(workdir / os.path.expanduser(raw)))
    real = Path(os.path.realpath(candidate))
    if not _inside(candidate, workdir) or not _inside(real, workdir):
        where = "" if _inside(candidate, workdir) else f", got {shown(raw)}"
        link = f" (a link to {shown(str(real), 120)})" if real != candidate else ""
        issues.append(
            SpecIssue(file, line, key, f"must be inside workdir ({workdir}){where}{link}")
        )
        return None
    kind = path_kind(real)
    if kind != "file":
        what = {"missing": "no such file", "directory": "is a directory"}.get(
            kind, "not a regular file"
        )
        issues.append(SpecIssue(file, line, key, f"{what}: {shown(str(candidate), 120)}"))
        return None
    return candidate.relative_to(workdir).as_posix()


def _parallelize_target(raw: Any) -> tuple[str, str] | None:
    """FILE and FUNCTION of a well-formed ``parallelize: FILE:FUNCTION``, else None
    (the model reports a malformed one)."""
    if not isinstance(raw, str) or not is_one_line(raw):
        return None
    try:
        return split_parallelize(raw)
    except ValueError:
        return None


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents
