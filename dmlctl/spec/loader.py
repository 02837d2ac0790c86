"""Load cluster and job files: every problem reported at once, with file:line.

All I/O of the spec layer lives here (reading files, checking paths, importing a
strategy's parameter model); the models in :mod:`dmlctl.spec.models` are pure.

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
from dmlctl.spec.messages import format_path, is_key_error, issue_parts
from dmlctl.spec.models import (
    ClusterSpec,
    HostSpec,
    JobSpec,
    duplicate_host_message,
    duplicate_host_names,
)
from dmlctl.spec.yamlpos import Document, KeyPath, YamlSyntaxError, parse
from dmlctl.strategies import registry

MAX_SPEC_BYTES = 1 << 20
"""Spec files larger than this are refused (they are a few hundred bytes in practice)."""

PROC_NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
"""One entry per GPU the NVIDIA driver sees (Linux)."""

_M = TypeVar("_M", bound=BaseModel)

_UUID_PREFIXES = ("GPU-", "MIG-")


def load_job(path: str | os.PathLike[str]) -> JobSpec:
    """Load and validate a job file.

    Beyond the model's checks: the strategy name must be registered and its params
    must satisfy the strategy's ``Params`` model (issues at ``strategy.params.<key>``);
    ``workdir`` must be a directory (relative paths are taken from the job file's
    directory) and ``script`` a file inside it. The returned spec has an absolute
    ``workdir``, ``script`` relative to it, and ``name`` filled in (default: the job
    file's directory name, reduced to letters, digits, ``.``, ``_`` and ``-``).
    """
    file = os.fspath(path)
    doc = _read_mapping(file, JobSpec)
    data: Mapping[str, Any] = doc.data
    issues = _duplicate_issues(file, doc)
    job = _validate(file, doc, JobSpec, data, issues)
    issues += _strategy_issues(file, doc, data.get("strategy", {}))
    job_dir = Path(file).absolute().parent
    workdir, script = _check_paths(file, doc, job_dir, data, issues)
    if issues or job is None or workdir is None or script is None:
        raise SpecError(_sorted(issues))
    name = job.name if job.name is not None else _name_from_dir(job_dir.name)
    return job.model_copy(update={"name": name, "workdir": str(workdir), "script": script})


def load_cluster(path: str | os.PathLike[str]) -> ClusterSpec:
    """Load and validate a cluster file (hosts, defaults; unique host names)."""
    file = os.fspath(path)
    doc = _read_mapping(file, ClusterSpec)
    issues = _duplicate_issues(file, doc)
    cluster = _validate(file, doc, ClusterSpec, doc.data, issues)
    if cluster is None:
        issues += _raw_duplicate_hosts(file, doc, doc.data.get("hosts"), issues)
    if issues or cluster is None:
        raise SpecError(_sorted(issues))
    return cluster


def default_cluster() -> ClusterSpec:
    """The cluster used when no cluster file is given: this machine, without SSH.

    One host named ``local`` at ``localhost`` with one slot per GPU when the NVIDIA
    driver reports GPUs (counted by :func:`count_local_gpus`, without importing
    torch), otherwise one slot per CPU core this process may run on.
    """
    slots = count_local_gpus() or _usable_cpus()
    return ClusterSpec(hosts=[HostSpec(name="local", address="localhost", slots=slots)])


def count_local_gpus(
    environ: Mapping[str, str] | None = None, proc_gpus: str | os.PathLike[str] = PROC_NVIDIA_GPUS
) -> int:
    """Number of NVIDIA GPUs this process may use, without importing torch or CUDA.

    Counts the entries of ``/proc/driver/nvidia/gpus`` (0 when it does not exist). If
    ``CUDA_VISIBLE_DEVICES`` is set, counts its entries the way CUDA reads them: up to
    the first one that is not a valid index or a ``GPU-``/``MIG-`` UUID, duplicates
    once, never more than the driver reports (``""`` or ``-1`` means none).
    """
    try:
        physical = len(os.listdir(proc_gpus))
    except OSError:
        return 0
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return physical
    seen: set[str] = set()
    for item in (part.strip() for part in visible.split(",")):
        valid_index = item.isdigit() and int(item) < physical
        if not (valid_index or item.startswith(_UUID_PREFIXES)):
            break
        seen.add(str(int(item)) if valid_index else item)
    return min(len(seen), physical)


def with_workers(job: JobSpec, n: int) -> JobSpec:
    """``job`` with ``workers`` set to ``n`` (the ``--workers N`` flag).

    Raises :class:`~dmlctl.errors.UsageError` when ``n`` is not an integer >= 1.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"--workers must be an integer >= 1, got {n!r}")
    return job.model_copy(update={"workers": n})


def _usable_cpus() -> int:
    # Affinity honours taskset/cgroup cpusets; cpu_count() is the whole machine.
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _read_mapping(file: str, model: type[BaseModel]) -> Document:
    """Read ``file`` as a YAML mapping or raise SpecError with one file-level issue."""

    def fail(line: int | None, message: str) -> SpecError:
        return SpecError([SpecIssue(file, line, "", message)])

    try:
        with open(file, "rb") as stream:
            raw = stream.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise fail(None, "no such file") from None
    except IsADirectoryError:
        raise fail(None, "is a directory; expected a YAML file") from None
    except PermissionError:
        raise fail(None, "cannot read the file: permission denied") from None
    except OSError as exc:
        raise fail(None, f"cannot read the file: {exc.strerror or exc}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise fail(None, f"file is larger than {MAX_SPEC_BYTES} bytes; not a spec file")
    if b"\x00" in raw:
        raise fail(None, "not a text file (contains NUL bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise fail(None, f"not a text file (not valid UTF-8 at byte {exc.start})") from None
    try:
        doc = parse(text)
    except YamlSyntaxError as exc:
        raise fail(exc.line, exc.message) from None
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
    return f"a scalar ({value!r})" if not isinstance(value, str) else f"a string ({value!r})"


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


def _issues_from(
    file: str, doc: Document, exc: ValidationError, model: type[BaseModel], prefix: KeyPath
) -> Iterable[SpecIssue]:
    for error in exc.errors(include_url=False):
        rel, message = issue_parts(error, model)
        path: KeyPath = (*prefix, *rel)
        # A missing key has no line of its own: point at the mapping that lacks it.
        line = doc.line_of(path[:-1] if error["type"] == "missing" else path)
        yield SpecIssue(file, line, format_path(path, ends_in_key=is_key_error(error)), message)


def _raw_duplicate_hosts(
    file: str, doc: Document, hosts: Any, known: list[SpecIssue]
) -> list[SpecIssue]:
    """Duplicate host names pydantic did not check because other host errors stopped it."""
    if not isinstance(hosts, list):
        return []
    names: list[str | None] = []
    for host in hosts:
        name = None
        if isinstance(host, dict):
            name = host.get("name") if host.get("name") is not None else host.get("address")
        names.append(name if isinstance(name, str) else None)
    issues = []
    for index, name, other in duplicate_host_names(names):
        path: KeyPath = ("hosts", index, "name")
        issue = SpecIssue(
            file, doc.line_of(path), format_path(path), duplicate_host_message(name, other)
        )
        if issue not in known:
            issues.append(issue)
    return issues


def _strategy_issues(file: str, doc: Document, raw: Any) -> list[SpecIssue]:
    """Issues of the strategy's params against the strategy's own ``Params`` model.

    Unknown names and wrong shapes are reported by :class:`StrategySpec` itself;
    this only runs when the name is registered and ``params`` is a mapping.
    """
    if not isinstance(raw, dict):
        return []  # shorthand `strategy: ssgd` has no params; other shapes: model's job
    name = raw.get("name", "ssgd")
    params = raw.get("params", {})
    if not isinstance(name, str) or not isinstance(params, dict):
        return []
    try:
        registry.entry(name)
    except registry.UnknownStrategy:
        return []
    model = registry.load(name).Params
    try:
        model.model_validate(params)
    except ValidationError as exc:
        return list(_issues_from(file, doc, exc, model, prefix=("strategy", "params")))
    return []


def _check_paths(
    file: str, doc: Document, job_dir: Path, data: Mapping[str, Any], issues: list[SpecIssue]
) -> tuple[Path | None, str | None]:
    """Absolute workdir and script relative to it; problems appended to ``issues``."""
    raw_workdir = data.get("workdir", ".")
    if not isinstance(raw_workdir, str) or not raw_workdir:
        return None, None  # the model reports the type
    workdir = (job_dir / Path(raw_workdir).expanduser()).resolve()
    if not workdir.is_dir():
        what = "not a directory" if workdir.exists() else "no such directory"
        issues.append(SpecIssue(file, doc.line_of(("workdir",)), "workdir", f"{what}: {workdir}"))
        return None, None
    raw_script = data.get("script")
    if not isinstance(raw_script, str) or not raw_script:
        return workdir, None
    line = doc.line_of(("script",))
    candidate = Path(os.path.normpath(workdir / Path(raw_script).expanduser()))
    try:
        relative = candidate.relative_to(workdir)
    except ValueError:
        issues.append(
            SpecIssue(
                file, line, "script", f"must be inside workdir ({workdir}), got {raw_script!r}"
            )
        )
        return workdir, None
    if not candidate.is_file():
        what = "is a directory" if candidate.is_dir() else "no such file"
        issues.append(SpecIssue(file, line, "script", f"{what}: {candidate}"))
        return workdir, None
    return workdir, relative.as_posix()


_NOT_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _name_from_dir(directory: str) -> str:
    """A valid job name from a directory name (``my run`` -> ``my-run``; ``job`` if none)."""
    name = _NOT_NAME.sub("-", directory).lstrip("._-")
    return name or "job"


def _sorted(issues: list[SpecIssue]) -> list[SpecIssue]:
    return sorted(issues, key=lambda i: (i.line if i.line is not None else 0, i.path))
