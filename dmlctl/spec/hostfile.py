"""Hostfiles (DeepSpeed / Open MPI format) as cluster specs.

A hostfile lists one machine per line::

    # name        workers
    gpu1          slots=4
    gpu2          slots=4 max_slots=8   # max_slots is MPI's; accepted and ignored
    10.0.0.3                            # slots default to 1

Each host gets ``name = address = hostname``; the hostname may be an alias from
``~/.ssh/config``, which the SSH layer resolves (not this module). Every other
setting takes the cluster defaults of :class:`~dmlctl.spec.cluster.HostDefaults`.

Promises of :func:`load_hostfile` and :func:`load_cluster_file`: the same as
:mod:`dmlctl.spec.loader`'s: a valid frozen :class:`ClusterSpec`, or a
:class:`~dmlctl.errors.SpecError` carrying every issue, each with its line.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable

from pydantic import ValidationError

from dmlctl.errors import SpecError, SpecIssue
from dmlctl.spec.cluster import ClusterSpec, HostSpec
from dmlctl.spec.fields import (
    MAX_HOSTS,
    MAX_SLOTS,
    check_host_text,
    check_text,
    is_host_text,
    shown,
)
from dmlctl.spec.loader import cluster_from_yaml
from dmlctl.spec.source import read_text

HOSTFILE_SUFFIXES = (".hostfile", ".txt")
"""File name endings that mark a cluster file as a hostfile (as does the name ``hostfile``)."""

_SLOTS = "slots"
_IGNORED = ("max_slots", "max-slots")
_KEYS = (_SLOTS, *_IGNORED)

# A hostname (host name characters, or MPICH's host:N; not a YAML key ending in ':')
# then only key=value tokens, then maybe a comment.
_HOSTFILE_LINE = re.compile(
    r"^[A-Za-z0-9_:][A-Za-z0-9_.:%-]*(?<!:)(?:[ \t]+[\w-]+=[^\s#]*)*[ \t]*(?:#.*)?$"
)
_MPICH_ENTRY = re.compile(r"^([^:\[\]]+):(\d+)$")
_COUNT = re.compile(r"^[0-9]+$")
_FIELDS = re.compile(r"[ \t]+")

_Issue = Callable[[str, str], None]


def load_hostfile(path: str | os.PathLike[str]) -> ClusterSpec:
    """Load and validate a hostfile (see :func:`cluster_from_hostfile`)."""
    file = os.fspath(path)
    return cluster_from_hostfile(file, read_text(file, "a hostfile"))


def load_cluster_file(path: str | os.PathLike[str]) -> ClusterSpec:
    """Load a cluster file that is either YAML or a hostfile (see :func:`is_hostfile`)."""
    file = os.fspath(path)
    text = read_text(file, "a cluster file (YAML or hostfile)")
    if is_hostfile(file, text):
        return cluster_from_hostfile(file, text)
    return cluster_from_yaml(file, text)


def is_hostfile(file: str, text: str) -> bool:
    """True when ``file`` is to be read as a hostfile rather than YAML.

    That is when its name is ``hostfile`` or ends in ``.hostfile`` / ``.txt``, or when
    its first line that is neither blank nor a comment parses as a hostfile line:
    ``hostname [key=value]...`` with a host name of letters, digits, ``.``, ``-``,
    ``_``, ``:`` (not like YAML: ``key:``, ``- item``, ``{...}``, ``---``). Anything
    else (binary bytes, control characters, an empty file) is YAML. Either way every
    line is then parsed strictly: a hostfile line that does not parse is an issue,
    never a host.
    """
    name = os.path.basename(file)
    if name == "hostfile" or name.endswith(HOSTFILE_SUFFIXES):
        return True
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return _HOSTFILE_LINE.match(stripped) is not None
    return False


def cluster_from_hostfile(file: str, text: str) -> ClusterSpec:
    """The cluster described by ``text``, the content of the hostfile ``file``.

    Lines are ``hostname [slots=N] [max_slots=M]``; ``#`` starts a comment and blank
    lines are skipped. ``slots`` defaults to 1; ``max_slots`` (or ``max-slots``) must
    be an integer and is otherwise ignored. Unknown tokens, bad values, bad host names
    and repeated hosts (compared case-insensitively) are issues at their line.
    """
    issues: list[SpecIssue] = []
    hosts: list[HostSpec] = []
    first_line: dict[str, int] = {}
    # Only \n ends a line (str.splitlines also splits at control characters, which
    # would hide them); \r\n endings are accepted.
    for number, line in enumerate(text.split("\n"), start=1):

        def issue(path: str, message: str, number: int = number) -> None:
            issues.append(SpecIssue(file, number, path, message))

        try:
            check_text(line.removesuffix("\r"))
        except ValueError as exc:
            issue("", f"line {exc}")
            continue
        content = line.split("#", 1)[0].strip(" \t\r")
        if not content:
            continue
        hostname, *tokens = _FIELDS.split(content)
        slots = _slots(tokens, issue)
        if not _hostname_ok(hostname, issue):
            continue
        key = hostname.lower()
        if key in first_line:
            issue("", f"duplicate host {shown(hostname)} (first at line {first_line[key]})")
            continue
        first_line[key] = number
        if slots is not None:
            try:
                hosts.append(HostSpec(name=hostname, address=hostname, slots=slots))
            except ValidationError as exc:  # the checks above should leave none
                issue("", f"bad host name {shown(hostname)}: {exc.errors()[0]['msg']}")
    if len(hosts) > MAX_HOSTS:
        issues.append(SpecIssue(file, None, "", f"{len(hosts)} hosts; at most {MAX_HOSTS}"))
    if not hosts and not issues:
        issues.append(SpecIssue(file, None, "", "no hosts; expected lines like 'gpu1 slots=4'"))
    if issues:
        raise SpecError(sorted(issues, key=lambda i: (i.line or 0, i.path)))
    return ClusterSpec(hosts=hosts)


def _slots(tokens: list[str], issue: _Issue) -> int | None:
    """The ``slots`` value of one line (1 when absent); ``None`` after an issue."""
    slots = 1
    seen: set[str] = set()
    ok = True
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or key not in _KEYS:
            issue("", _unknown_token(token, key if sep else None))
            ok = False
        elif key in seen:
            issue(key, f"given twice on this line ({shown(token)})")
            ok = False
        elif not _COUNT.match(value) or not _in_range(key, value):
            least = 1 if key == _SLOTS else 0
            issue(
                key,
                f"bad {key} value {shown(value)}; expected an integer from {least} to {MAX_SLOTS}",
            )
            ok = False
        else:
            seen.add(key)
            if key == _SLOTS:
                slots = int(value)
    return slots if ok else None


def _in_range(key: str, value: str) -> bool:
    return len(value) <= 6 and (1 if key == _SLOTS else 0) <= int(value) <= MAX_SLOTS


def _unknown_token(token: str, key: str | None) -> str:
    if key is None:
        return f"unknown token {shown(token)}; expected 'hostname [slots=N]' (one host per line)"
    close = difflib.get_close_matches(key[:100], _KEYS, n=1, cutoff=0.6)
    if close:
        return f"unknown token {shown(token)}; did you mean '{close[0]}='?"
    return f"unknown token {shown(token)}; expected slots=N (or MPI's max_slots=N)"


def _hostname_ok(hostname: str, issue: _Issue) -> bool:
    mpich = _MPICH_ENTRY.match(hostname)
    if mpich and is_host_text(mpich.group(1)):
        host, count = mpich.groups()
        problem = f"{shown(hostname)} is MPICH syntax; write '{host} slots={count}'"
    elif hostname.endswith(":"):
        problem = f"expected 'hostname [slots=N]', got {shown(hostname)}; is this a YAML file?"
    elif hostname.startswith("-"):
        problem = f"bad host name {shown(hostname)}: must not start with '-'"
    elif "/" in hostname:
        problem = f"bad host name {shown(hostname)}: must not contain '/'"
    else:
        try:
            check_host_text(hostname, "host name")
        except ValueError as exc:
            problem = f"bad host name: {exc}"
        else:
            return True
    issue("", problem)
    return False
