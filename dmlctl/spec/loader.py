"""Load cluster and job files: every problem reported at once, with file:line.

The I/O of the spec layer lives here and in :mod:`dmlctl.spec.source` (reading files,
checking paths, importing a strategy's parameter model); the models in
:mod:`dmlctl.spec.models` and :mod:`dmlctl.spec.cluster` are pure. Hostfiles are read
by :mod:`dmlctl.spec.hostfile`.

Promises of :func:`load_job` and :func:`load_cluster`:

* they return a fully validated, frozen spec or raise :class:`~dmlctl.errors.SpecError`
  carrying *every* issue found, sorted by line; never another exception for any
  file content (a missing or broken strategy module is an installation problem and
  is not covered);
* each issue names the file as the caller spelled it, the 1-based line (``None``
  only when the file as a whole is at fault), a ``hosts[1].slots``-style key path and
  a short message (see :mod:`dmlctl.spec.messages`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from dmlctl.errors import SpecError, SpecIssue, UsageError
from dmlctl.protocol import DEFAULT_STRATEGY
from dmlctl.spec.advice import AdviceProblem, apply_advice, wants_advice
from dmlctl.spec.cluster import ClusterSpec, HostKey, duplicate_hosts
from dmlctl.spec.job_paths import check_paths, is_one_line
from dmlctl.spec.local import PROC_NVIDIA_GPUS, count_local_gpus, default_cluster
from dmlctl.spec.messages import describe, format_path, is_key_error, issue_parts
from dmlctl.spec.models import JobSpec
from dmlctl.spec.ranks import RANK_STARTS
from dmlctl.spec.source import MAX_SPEC_BYTES, path_kind, read_text
from dmlctl.spec.yamlpos import Document, KeyPath, YamlSyntaxError, parse
from dmlctl.strategies import registry

__all__ = [
    "MAX_SPEC_BYTES",
    "PROC_NVIDIA_GPUS",
    "cluster_from_yaml",
    "count_local_gpus",
    "default_cluster",
    "load_cluster",
    "load_job",
    "with_rank_start",
    "with_workers",
]

_M = TypeVar("_M", bound=BaseModel)

_DEFAULT_SSH_PORT = 22


def load_job(path: str | os.PathLike[str]) -> JobSpec:
    """Load and validate a job file.

    Beyond the model's checks (among them: the strategy name must be registered and
    its params satisfy the strategy's ``Params`` model, issues at
    ``strategy.params.<key>``; the spec keeps that validated object):
    ``workdir`` must be a directory (relative paths are taken from the job file's
    directory), ``script`` a file inside it, and so the file of ``parallelize:
    FILE:FUNCTION``. The returned spec has an absolute
    ``workdir``, ``script`` relative to it, and ``name`` filled in (default: the job
    file's directory name, reduced to letters, digits, ``.``, ``_`` and ``-``).
    """
    file = os.fspath(path)
    doc = _parse_mapping(file, read_text(file, "a YAML file"), JobSpec)
    data: Mapping[str, Any] = doc.data
    issues = _duplicate_issues(file, doc)
    job_dir = Path(file).absolute().parent
    data, advice = _advised(file, doc, data, job_dir, issues)
    job = _validate(file, doc, JobSpec, data, issues)
    workdir, script = check_paths(file, doc, job_dir, data, issues)
    if issues or job is None or workdir is None or script is None:
        raise SpecError(_sorted(issues))
    name = job.name if job.name is not None else _name_from_dir(job_dir.name)
    update = {"name": name, "workdir": str(workdir), "script": script, "advice": advice}
    return job.model_copy(update=update)


def _advised(
    file: str, doc: Document, data: Mapping[str, Any], job_dir: Path, issues: list[SpecIssue]
) -> tuple[Mapping[str, Any], str | None]:
    """``data`` with the strategy of its advice file when the strategy is ``auto``
    (:mod:`dmlctl.spec.advice`), and the note saying so; problems go to ``issues``."""
    if "advice" in data:
        line = doc.line_of(("advice",))
        message = "is set by dmlctl; use strategy: {name: auto, advice: FILE}"
        issues.append(SpecIssue(file, line, "advice", message))
    if not wants_advice(data):
        return data, None
    try:
        return apply_advice(data, job_dir)
    except AdviceProblem as exc:
        issues.append(SpecIssue(file, doc.line_of(exc.path), ".".join(exc.path), str(exc)))
        return {k: v for k, v in data.items() if k != "strategy"}, None


def load_cluster(path: str | os.PathLike[str]) -> ClusterSpec:
    """Load and validate a YAML cluster file (see :func:`cluster_from_yaml`).

    For a file that may be a hostfile, use :func:`dmlctl.spec.hostfile.load_cluster_file`.
    """
    file = os.fspath(path)
    return cluster_from_yaml(file, read_text(file, "a YAML cluster file"))


def cluster_from_yaml(file: str, text: str) -> ClusterSpec:
    """Validate ``text``, the content of the YAML cluster file ``file``.

    Beyond the model's checks (unique host names; no two non-local hosts with the
    same address and port): every ``identity_file`` (in ``defaults`` or a host) must
    be an existing file; ``~`` is expanded and relative paths are taken from the
    directory of ``file``. The returned spec carries those paths absolute.
    ``workdir`` values are remote paths and are kept as written.
    """
    doc = _parse_mapping(file, text, ClusterSpec)
    issues = _duplicate_issues(file, doc)
    cluster = _validate(file, doc, ClusterSpec, doc.data, issues)
    if cluster is None:
        issues += _raw_duplicate_hosts(file, doc, issues)
    keys = _key_files(file, doc, Path(file).absolute().parent, issues)
    if issues or cluster is None:
        raise SpecError(_sorted(issues))
    return _with_key_files(cluster, keys)


def with_workers(job: JobSpec, n: int) -> JobSpec:
    """``job`` with ``workers`` set to ``n`` (the ``--workers N`` flag).

    Raises :class:`~dmlctl.errors.UsageError` when ``n`` is not an integer >= 1.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"--workers must be an integer >= 1, got {n!r}")
    return job.model_copy(update={"workers": n})


def with_rank_start(job: JobSpec, start: str) -> JobSpec:
    """``job`` with ``ranks.start`` set to ``start`` (the ``--ranks`` flag).

    Raises :class:`~dmlctl.errors.UsageError` for anything but ``fresh`` or ``warm``.
    """
    if start not in RANK_STARTS:
        raise UsageError(f"--ranks must be one of {', '.join(RANK_STARTS)}, got {start!r}")
    ranks = job.ranks.model_copy(update={"start": start})
    return job.model_copy(update={"ranks": ranks})


def _parse_mapping(file: str, text: str, model: type[BaseModel]) -> Document:
    """``text`` parsed as a YAML mapping, or SpecError with one file-level issue."""

    def fail(line: int | None, message: str, path: KeyPath = ()) -> SpecError:
        return SpecError([SpecIssue(file, line, format_path(path) if path else "", message)])

    try:
        doc = parse(text)
    except YamlSyntaxError as exc:
        raise fail(exc.line, exc.message, exc.path) from None
    keys = ", ".join(model.model_fields)
    if doc.data is None and _only_comments(text):
        raise fail(None, f"file is empty; expected a mapping with keys {keys}")
    if not isinstance(doc.data, dict):
        got = _kind(doc.data)
        raise fail(doc.line_of(()), f"expected a mapping at the top level, got {got}")
    return doc


def _only_comments(text: str) -> bool:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and stripped not in ("---", "..."):
            return False
    return True


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    what = "a string" if isinstance(value, str) else "a scalar"
    return f"{what} ({describe(value)})"


def _duplicate_issues(file: str, doc: Document) -> list[SpecIssue]:
    return [
        SpecIssue(
            file,
            d.line,
            format_path(d.path),
            f"duplicate key {d.path[-1]!r} (first at line {d.first_line})",
        )
        for d in doc.duplicates
    ]


def _validate(
    file: str, doc: Document, model: type[_M], data: Any, issues: list[SpecIssue]
) -> _M | None:
    """``model`` validated strictly from ``data``; failures appended to ``issues``."""
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        issues += _issues_from(file, doc, exc, model, prefix=())
        return None


_ASKED_BY: dict[KeyPath, KeyPath] = {("parameter_servers",): ("strategy",)}
"""Keys whose default can be wrong because of another key: an error about one the file
leaves out points at the key that needs it (``strategy: asgd`` needs servers)."""


def _written(doc: Document, path: KeyPath) -> KeyPath:
    """``path``, or the key that asked for it when the file does not have it."""
    return path if path in doc.lines else _ASKED_BY.get(path, path)


def _issues_from(
    file: str, doc: Document, exc: ValidationError, model: type[BaseModel], prefix: KeyPath
) -> Iterable[SpecIssue]:
    params = _params_model(doc.data.get("strategy")) if model is JobSpec else None
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        if params is not None and loc[: len(_PARAMS)] == _PARAMS and len(loc) > len(_PARAMS):
            # Below strategy.params the strategy's own model knows the keys (did-you-mean).
            rel, message = issue_parts({**error, "loc": loc[len(_PARAMS) :]}, params)
            rel = (*_PARAMS, *rel)
        else:
            rel, message = issue_parts(error, model)
        path: KeyPath = (*prefix, *rel)
        # A missing key has no line of its own: point at the mapping that lacks it.
        line = doc.line_of(path[:-1] if error["type"] == "missing" else _written(doc, path))
        yield SpecIssue(file, line, format_path(path, ends_in_key=is_key_error(error)), message)


def _raw_duplicate_hosts(file: str, doc: Document, known: list[SpecIssue]) -> list[SpecIssue]:
    """Duplicate hosts pydantic did not check because other errors stopped it."""
    hosts = doc.data.get("hosts")
    if not isinstance(hosts, list):
        return []
    defaults = doc.data.get("defaults")
    default_port: int | None = _DEFAULT_SSH_PORT
    if isinstance(defaults, dict) and "port" in defaults:
        default_port = _port(defaults["port"])
    keys = [HostKey(None, None, None)] * len(hosts)
    for index, host in enumerate(hosts):
        if not isinstance(host, dict):
            continue
        address = host.get("address")
        address = address if isinstance(address, str) and address else None
        name = host.get("name") if host.get("name") is not None else address
        port = default_port if host.get("port") is None else _port(host["port"])
        keys[index] = HostKey(name if isinstance(name, str) else None, address, port)
    issues = []
    for dup in duplicate_hosts(keys):
        path: KeyPath = ("hosts", dup.index, dup.field)
        issue = SpecIssue(file, doc.line_of(path), format_path(path), dup.message)
        if issue not in known:
            issues.append(issue)
    return issues


def _port(value: Any) -> int | None:
    valid = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535
    return value if valid else None


def _key_files(file: str, doc: Document, base: Path, issues: list[SpecIssue]) -> dict[KeyPath, str]:
    """Absolute path of every usable ``identity_file``, by the key path of its mapping."""
    owners: list[KeyPath] = [("defaults",)]
    hosts = doc.data.get("hosts")
    if isinstance(hosts, list):
        owners += [("hosts", index) for index in range(len(hosts))]
    found: dict[KeyPath, str] = {}
    for owner in owners:
        mapping = _at(doc.data, owner)
        raw = mapping.get("identity_file") if isinstance(mapping, dict) else None
        if not isinstance(raw, str) or not is_one_line(raw):
            continue  # absent, or the model reports it
        path, problem = _key_file(base, raw)
        if problem is None:
            found[owner] = path
        else:
            key: KeyPath = (*owner, "identity_file")
            issues.append(SpecIssue(file, doc.line_of(key), format_path(key), problem))
    return found


def _key_file(base: Path, raw: str) -> tuple[str, str | None]:
    """``(absolute path, None)`` for an existing file, else ``(path, problem)``."""
    expanded = os.path.expanduser(raw)
    if expanded.startswith("~"):
        user = expanded.split("/", 1)[0]
        return expanded, f"cannot expand {user!r}: no such user (or no home directory)"
    path = os.path.normpath(os.path.join(base, expanded))
    kind = path_kind(path)
    if kind == "file":
        return path, None
    if kind == "missing":
        return path, f"no such key file: {path}"
    what = "a directory" if kind == "directory" else "not a regular file"
    return path, f"not a key file ({what}): {path}"


def _with_key_files(cluster: ClusterSpec, keys: Mapping[KeyPath, str]) -> ClusterSpec:
    if not keys:
        return cluster
    defaults = cluster.defaults
    if ("defaults",) in keys:
        defaults = defaults.model_copy(update={"identity_file": keys["defaults",]})
    hosts = [
        h.model_copy(update={"identity_file": keys["hosts", i]}) if ("hosts", i) in keys else h
        for i, h in enumerate(cluster.hosts)
    ]
    return cluster.model_copy(update={"defaults": defaults, "hosts": hosts})


def _at(data: Any, path: KeyPath) -> Any:
    for part in path:
        if isinstance(part, int):
            data = data[part] if isinstance(data, list) and part < len(data) else None
        else:
            data = data.get(part) if isinstance(data, dict) else None
    return data


_PARAMS: KeyPath = ("strategy", "params")


def _params_model(raw: Any) -> type[BaseModel] | None:
    """The ``Params`` model of the job's strategy (the raw ``strategy`` value), or
    None when the name is not a registered one."""
    name = raw.get("name", DEFAULT_STRATEGY) if isinstance(raw, dict) else raw or DEFAULT_STRATEGY
    if not isinstance(name, str):
        return None
    try:
        registry.entry(name)
    except registry.UnknownStrategy:
        return None
    return registry.load(name).Params


_NOT_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _name_from_dir(directory: str) -> str:
    """A valid job name from a directory name (``my run`` -> ``my-run``; ``job`` if none)."""
    name = _NOT_NAME.sub("-", directory).lstrip("._-")
    return name or "job"


def _sorted(issues: list[SpecIssue]) -> list[SpecIssue]:
    return sorted(issues, key=lambda i: (i.line if i.line is not None else 0, i.path))
