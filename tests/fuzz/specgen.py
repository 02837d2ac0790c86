"""Hostile spec files for ``dmlctl launch FILE --dry-run``, and the property they must meet.

Every generated case is a set of files (job, cluster or hostfile; sometimes a FIFO,
a directory or a symbolic link instead) plus what the answer must be:

* ``"ok"`` — every value was drawn from the valid range: exit 0 with a plan;
* ``"bad"`` — at least one value is known garbage: exit 2;
* ``"any"`` — values whose validity depends on their combination: exit 0 or 2.

:func:`check` runs the real CLI entry point in this process (``dmlctl.cli.app.main``)
under a 2 s alarm and returns the list of property violations: a traceback, exit 3
(internal error), a hang, garbage accepted (exit 0 for a ``"bad"`` case, or a plan
holding control characters), a valid spec refused, an error line that is longer
than 300 characters or does not name the file, or a run directory created.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

Verdict = str  # "ok" | "bad" | "any"
LIMIT_S = 2.0
MAX_LINE = 300
SPECIAL = ("fifo", "directory", "devnull", "loop", "fifo-link", "missing")


def _local_slots() -> int:
    from dmlctl.spec import default_cluster

    return default_cluster().total_slots


LOCAL_SLOTS = _local_slots()


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Drawn:
    """A value and whether it is valid where it was put."""

    value: Any
    verdict: Verdict


def _pick(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Drawn]:
    """A valid value three times in four, else a known-bad one."""
    valid = good.map(lambda v: Drawn(v, "ok"))
    invalid = bad.map(lambda v: Drawn(v, "bad"))
    # Not a boundary value: Hypothesis draws those (0 and 4 here) more often.
    return st.integers(0, 4).flatmap(lambda i: invalid if i == 2 else valid)


_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"
_HOSTILE_CHARS = [
    "\x00",
    "\n",
    "\r",
    "\x1b",
    "\x1b[31m",
    "\x7f",
    "\x9b",
    "\ud800",
    "\udc80",
    "\x08",
]
_FINE_TEXT = st.text(
    alphabet=st.characters(
        codec="utf-8", exclude_categories=("Cc", "Cs"), exclude_characters="\u2028\u2029\x85"
    ),
    min_size=1,
    max_size=30,
)
_WORD = st.text(alphabet=_NAME_CHARS, min_size=1, max_size=20)
_HUGE_INTS = st.sampled_from([2**63, 2**64 + 1, 10**29, 10**300, -(2**63) - 1, 10**999])
_NON_FINITE = st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308 * 10])
_OTHER_TYPES = st.sampled_from([[], {}, [1], {"a": 1}, None, "x", "1"])


def hostile_text(multiline: bool = False) -> st.SearchStrategy[str]:
    """Text with a NUL, control character, lone surrogate or line break in it (line
    breaks only count as hostile where a value is one line)."""
    chars = [c for c in _HOSTILE_CHARS if multiline is False or c not in ("\n", "\r")]
    return st.builds(
        lambda a, c, b: a + c + b, _FINE_TEXT | st.just(""), st.sampled_from(chars), _WORD
    )


def ints(low: int, high: int) -> st.SearchStrategy[Drawn]:
    """An integer field bounded to ``[low, high]``."""
    bad = st.one_of(
        st.booleans(),
        st.integers(max_value=low - 1).filter(lambda n: n > -(10**40)),
        st.integers(min_value=high + 1, max_value=high * 1000 + 10),
        _HUGE_INTS,
        st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)),
        st.just(1.0),
        _NON_FINITE,
        st.lists(st.integers(), max_size=2),
        hostile_text(),
    )
    return _pick(st.integers(low, high), bad)


def seconds(low: float, high: float, low_open: bool = False) -> st.SearchStrategy[Drawn]:
    """A duration in ``[low, high]`` (``(low, high]`` when ``low_open``)."""
    good = st.floats(low, high, exclude_min=low_open, allow_nan=False)
    bad = st.one_of(
        st.booleans(),
        _NON_FINITE,
        st.floats(min_value=high * 2, max_value=1e300),
        st.floats(max_value=low - 0.001, min_value=-1e9),
        hostile_text(),
        st.just("10s"),
    )
    return _pick(good, bad)


def one_line(good: st.SearchStrategy[str]) -> st.SearchStrategy[Drawn]:
    """A single-line string field."""
    bad = st.one_of(
        hostile_text(),
        st.just(""),
        st.just("   "),
        st.integers(4097, 5000).map(lambda n: "a" * n),
        st.integers(),
        st.booleans(),
        st.lists(_WORD, max_size=2),
    )
    return _pick(good, bad)


def host_names(index: int = 0) -> st.SearchStrategy[Drawn]:
    """Host names and addresses; valid ones are made unique by ``index``."""
    good = st.one_of(
        st.builds(lambda a, b: f"{a}.{b}{index}", _WORD, _WORD),
        st.builds(lambda a: f"{a}{index}", _WORD),
        st.sampled_from([f"10.0.0.{index + 1}", f"fe80::{index + 1}%eth0", f"gpu_box{index}"]),
    )
    bad = st.one_of(
        hostile_text(),
        st.builds(lambda w: "-" + w, _WORD),
        st.builds(lambda a, b: f"{a} {b}", _WORD, _WORD),
        st.builds(lambda a, b: f"{a}/{b}", _WORD, _WORD),
        st.builds(lambda w: w + "\u00e9", _WORD),
        st.integers(254, 300).map(lambda n: "a" * n),
        st.just(""),
        st.integers(),
    )
    return _pick(good, bad)


def env_maps() -> st.SearchStrategy[Drawn]:
    names = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,15}\Z").filter(
        lambda n: (
            not n.startswith("DMLCTL_")
            and n not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
            and n not in ("MASTER_ADDR", "MASTER_PORT")
        )
    )
    values = st.one_of(
        _FINE_TEXT,
        st.just("line one\nline two\n"),
        st.just("postgres://u:s3cret-xyz@h/db"),
    )
    good = st.dictionaries(names, values, max_size=3)
    bad_entry = st.one_of(
        st.tuples(names, hostile_text(multiline=True)),
        st.tuples(st.sampled_from(["RANK", "DMLCTL_X", "1A", "A-B", "", "A B"]), _WORD),
        st.tuples(names, st.integers(131_072, 131_100).map(lambda n: "x" * n)),
        st.tuples(names, st.one_of(st.integers(), st.booleans(), st.none(), st.lists(_WORD))),
    )
    bad = st.builds(lambda d, kv: {**d, kv[0]: kv[1]}, good, bad_entry)
    return _pick(good, bad)


def strategies_() -> st.SearchStrategy[Drawn]:
    """A strategy block: valid ones, refused values, and combinations left to the checks."""
    good = st.sampled_from(["ssgd", "none", "local-sgd", {"name": "bmuf", "params": {"period": 4}}])
    bad = st.one_of(
        st.sampled_from(["sgdd", "", "SSGD"]),
        hostile_text(),
        st.builds(
            lambda name, key, value: {"name": name, "params": {key: value}},
            st.sampled_from(["local-sgd", "bmuf", "easgd", "dpsgd"]),
            st.just("period"),
            st.one_of(st.booleans(), _NON_FINITE, _HUGE_INTS, st.just(0), st.just(2.5)),
        ),
        st.builds(
            lambda v: {"name": "ssgd", "params": {"bucket_cap_mb": v}},
            st.one_of(st.booleans(), _NON_FINITE, st.just(1e29), st.just(-1)),
        ),
        st.just({"name": "ssgd", "params": {"nope": 1}}),
        st.just({"name": "ssgd", "params": []}),
    )
    unsure = st.builds(
        lambda name, alpha: {"name": name, "params": {"alpha": alpha}},
        st.sampled_from(["easgd"]),
        st.floats(0.01, 1.0),
    ).map(lambda v: Drawn(v, "any"))
    return st.one_of(_pick(good, bad), unsure)


# --------------------------------------------------------------------------- documents


@dataclass
class Case:
    """Files to write (name → text, bytes or a :data:`SPECIAL` kind), the argv after
    ``dmlctl``, and the expected answer."""

    kind: str
    files: dict[str, Any]
    argv: list[str]
    verdict: Verdict
    why: list[str] = field(default_factory=list)


def _combine(verdicts: list[Verdict]) -> Verdict:
    if "bad" in verdicts:
        return "bad"
    return "any" if "any" in verdicts else "ok"


def _render(data: Any, style: int) -> str:
    """YAML text of ``data``: block or flow style, unicode escaped or raw."""
    try:
        return yaml.safe_dump(
            data, default_flow_style=style == 1, allow_unicode=style == 2, sort_keys=False
        )
    except (yaml.YAMLError, UnicodeError, ValueError):
        return yaml.safe_dump(data, allow_unicode=False, sort_keys=False)


_RAW_JOBS = [
    "script: train.py\nworkers: &w 1\nargs: [*w]\n",
    "script: train.py\nworkers: 1\nworkers: 2\n",
    "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: &d [*c, *c]\nscript: train.py\nargs: *d\n",
    "script: train.py\nenv: &e {A: '1'}\nsetup: *e\n",
    "script: !!python/object/apply:os.system ['true']\n",
    "script: train.py\nworkers: " + "9" * 5000 + "\n",
    "script: train.py\nworkers: 1e29\n",
    "script: train.py\nworkers: 1.0e+29\n",
    "script: train.py\nworkers: .inf\n",
    "script: train.py\nworkers: true\n",
    "script: train.py\nrestart: {hang_timeout: .nan}\n",
    "script: train.py\nrestart: {backoff_max: 1e300}\n",
    "script: train.py\ncheckpoint: {every_steps: 0}\n",
    "script: train.py\n" + "x:\n " * 2000 + "y\n",
    "script: train.py\nargs: " + "[" * 5000 + "]" * 5000 + "\n",
    "[" * 100000,
    "script: train.py\nenv:\n  BIG: '" + "x" * 300_000 + "'\n",
    'script: train.py\ncheckpoint: {dir: "/tmp/a\\0b"}\n',
    'script: train.py\nenv: {DB: "a\\0b"}\n',
    'script: train.py\nsetup: "echo \\e[31m"\n',
    'script: train.py\nworkdir: "\\udc80"\n',
    'script: train.py\nworkdir: "a\\0b"\n',
    'script: "train.py\\nrm -rf /"\n',
    "\ufeffscript: train.py\n",
    "script: train.py\n\x1b[2J: 1\n",
    "---\nscript: train.py\n---\nscript: train.py\n",
]
_RAW_JOB_VERDICTS = ["bad"] * len(_RAW_JOBS)
_RAW_JOB_VERDICTS[_RAW_JOBS.index("\ufeffscript: train.py\n")] = "ok"


def _job_dict(draw: st.DrawFn) -> tuple[dict[str, Any], list[Verdict], list[str]]:
    data: dict[str, Any] = {"script": "train.py"}
    verdicts: list[Verdict] = []
    why: list[str] = []

    def put(key: str, drawn: Drawn) -> None:
        data[key] = drawn.value
        verdicts.append(drawn.verdict)
        if drawn.verdict != "ok":
            why.append(f"{key}={drawn.verdict}")

    fields: dict[str, Callable[[], st.SearchStrategy[Drawn]]] = {
        "workers": lambda: ints(1, LOCAL_SLOTS),
        "name": lambda: one_line(st.from_regex(r"\A[a-z0-9][a-z0-9._-]{0,20}\Z")),
        "args": lambda: _pick(
            st.lists(_FINE_TEXT, max_size=3),
            st.one_of(
                st.lists(hostile_text(multiline=True), min_size=1, max_size=2),
                st.just("--lr 0.1"),
                st.lists(st.integers(), min_size=1, max_size=2),
            ),
        ),
        "env": env_maps,
        "strategy": strategies_,
        "setup": lambda: _pick(
            st.just("pip install -r requirements.txt\necho ok"),
            st.one_of(hostile_text(multiline=True), st.just(""), st.integers()),
        ),
        "exclude": lambda: _pick(
            st.lists(st.sampled_from(["*.ckpt", "data/", "\\#x"]), max_size=3),
            st.lists(st.one_of(hostile_text(), st.just("#c")), min_size=1, max_size=2),
        ),
        "restart": lambda: _restart(draw),
        "checkpoint": lambda: _checkpoint(draw),
        "script": lambda: one_line(st.sampled_from(["train.py", "./train.py"])).map(
            lambda d: d if d.value != "train.py" or d.verdict == "ok" else Drawn("../x.py", "bad")
        ),
        "workdir": lambda: _pick(st.just("."), st.sampled_from(["missing-dir", "train.py"])),
        "max_hosts": lambda: ints(1, 4096),
        "parameter_servers": lambda: _pick(st.just(0), st.sampled_from([-1, True, 2.5, 10**30])),
    }
    chosen = draw(st.sets(st.sampled_from(sorted(fields)), max_size=5))
    for key in sorted(chosen):
        put(key, draw(fields[key]()))
    if draw(st.integers(0, 9)) == 7:
        put(
            draw(st.sampled_from(["wrokers", "scirpt", "enviroment", "\x1bkey", "k" * 300])),
            Drawn(1, "bad"),
        )
    return data, verdicts, why


def _restart(draw: st.DrawFn) -> st.SearchStrategy[Drawn]:
    keys = {
        "max_user_restarts": lambda: ints(0, 1000),
        "max_infra_restarts": lambda: ints(0, 1000),
        "backoff_initial": lambda: seconds(0, 604800, low_open=True),
        "hang_timeout": lambda: seconds(0, 604800, low_open=True),
        "stop_grace": lambda: seconds(0, 604800),
        "standby": lambda: _pick(st.booleans(), st.sampled_from([1, "yes", None, 0])),
    }
    chosen = draw(st.sets(st.sampled_from(sorted(keys)), min_size=1, max_size=3))
    drawn = {k: draw(keys[k]()) for k in sorted(chosen)}
    verdict = _combine([d.verdict for d in drawn.values()])
    return st.just(Drawn({k: d.value for k, d in drawn.items()}, verdict))


def _checkpoint(draw: st.DrawFn) -> st.SearchStrategy[Drawn]:
    keys = {
        "every_steps": lambda: ints(1, 10**9),
        "every_seconds": lambda: seconds(0, 604800, low_open=True),
        "keep": lambda: ints(1, 1000),
        "dir": lambda: one_line(st.sampled_from(["/tmp/ckpt/{run_id}", "ckpt"])),
        "allow_fresh_start": lambda: _pick(st.booleans(), st.sampled_from([1, "no", None])),
    }
    chosen = draw(st.sets(st.sampled_from(sorted(keys)), min_size=1, max_size=3))
    drawn = {k: draw(keys[k]()) for k in sorted(chosen)}
    verdict = _combine([d.verdict for d in drawn.values()])
    return st.just(Drawn({k: d.value for k, d in drawn.items()}, verdict))


@st.composite
def job_cases(draw: st.DrawFn) -> Case:
    """A job file (with train.py beside it), on the default cluster (this machine)."""
    files: dict[str, Any] = {"train.py": "print('hi')\n"}
    shape = draw(st.integers(0, 19))
    if shape == 0:
        files["job.yaml"] = draw(st.sampled_from(SPECIAL))
        return Case("job", files, ["launch", "job.yaml", "--dry-run"], "bad", ["special"])
    if shape == 1:
        index = draw(st.integers(0, len(_RAW_JOBS) - 1))
        files["job.yaml"] = _RAW_JOBS[index]
        return Case(
            "job",
            files,
            ["launch", "job.yaml", "--dry-run"],
            _RAW_JOB_VERDICTS[index],
            [f"raw {index}"],
        )
    if shape == 2:
        files["job.yaml"] = draw(st.binary(max_size=200))
        return Case("job", files, ["launch", "job.yaml", "--dry-run"], "any", ["binary"])
    if shape == 3:
        link = draw(st.sampled_from(["outside", "dir", "fifo"]))
        files["train.py"] = {"outside": "link-outside", "dir": "directory", "fifo": "fifo"}[link]
        files["job.yaml"] = "script: train.py\n"
        return Case("job", files, ["launch", "job.yaml", "--dry-run"], "bad", [f"script {link}"])
    data, verdicts, why = _job_dict(draw)
    files["job.yaml"] = _render(data, draw(st.integers(0, 2)))
    return Case("job", files, ["launch", "job.yaml", "--dry-run"], _combine(verdicts), why)


def _host_entry(
    draw: st.DrawFn, index: int | None
) -> tuple[dict[str, Any], list[Verdict], list[str]]:
    """Host ``index`` of a cluster, or its ``defaults`` (``index`` None)."""
    host: dict[str, Any] = {}
    verdicts: list[Verdict] = []
    why: list[str] = []
    where = "defaults" if index is None else f"hosts[{index}]"
    if index is not None:
        address = draw(host_names(index))
        host["address"] = address.value
        verdicts.append(address.verdict)
        if address.verdict != "ok":
            why.append(f"{where}.address")
    fields: dict[str, Callable[[], st.SearchStrategy[Drawn]]] = {
        "slots": lambda: ints(1, 1024),
        "port": lambda: ints(1, 65535),
        "user": lambda: _pick(
            st.sampled_from(["ubuntu", "ml_user", "a.b", "user@corp"]),
            st.one_of(hostile_text(), st.just("-oProxy"), st.just("a b"), st.just("")),
        ),
        "python": lambda: _pick(
            st.sampled_from(["python3", "/opt/conda/bin/python"]),
            st.one_of(hostile_text(), st.just("conda run python"), st.just("")),
        ),
        "workdir": lambda: one_line(st.sampled_from(["~/work", "/scratch/w"])),
        "env": env_maps,
        "identity_file": lambda: _pick(st.just("key"), st.sampled_from(["nokey", ".", "fifo"])),
    }
    if index is not None:
        fields["name"] = lambda: host_names(index + 100)
    for key in sorted(draw(st.sets(st.sampled_from(sorted(fields)), max_size=3))):
        drawn = draw(fields[key]())
        host[key] = drawn.value
        verdicts.append(drawn.verdict)
        if drawn.verdict != "ok":
            why.append(f"{where}.{key}")
    return host, verdicts, why


@st.composite
def cluster_cases(draw: st.DrawFn) -> Case:
    """A YAML cluster file, used with a valid one-worker job."""
    files: dict[str, Any] = {
        "train.py": "print('hi')\n",
        "job.yaml": "script: train.py\n",
        "key": "not a real key\n",
        "fifo": "fifo",
    }
    argv = ["launch", "job.yaml", "--cluster", "cluster.yaml", "--dry-run"]
    shape = draw(st.integers(0, 14))
    if shape == 0:
        files["cluster.yaml"] = draw(st.sampled_from(SPECIAL))
        return Case("cluster", files, argv, "bad", ["special"])
    if shape == 1:
        files["cluster.yaml"] = draw(st.binary(min_size=1, max_size=200))
        return Case("cluster", files, argv, "any", ["binary"])
    if shape == 2:
        raw = draw(
            st.sampled_from(
                [
                    "hosts: []\n",
                    "hosts:\n - address: a\n   slots: 10000000\n",
                    "hosts:\n - address: a\n   slots: 9223372036854775808\n",
                    "hosts:\n - address: a\n   slots: 1e29\n",
                    "hosts:\n - {address: a, slots: .inf}\n",
                    "hosts:\n - address: a\n - address: A\n",
                    'hosts:\n - address: "a\\x1b[2Jb"\n',
                    "\x01\x02\x03 garbage\n",
                    "gpu1 \x00slots=2\n",
                    "héllo slots=2\n",
                ]
            )
        )
        files["cluster.yaml"] = raw
        return Case("cluster", files, argv, "bad", ["raw"])
    data: dict[str, Any] = {}
    verdicts: list[Verdict] = []
    why: list[str] = []
    if draw(st.booleans()):
        data["name"] = draw(st.sampled_from(["lab", "gpu-farm"]))
    if draw(st.integers(0, 3)) == 0:
        data["defaults"], dv, dw = _host_entry(draw, None)
        verdicts += dv
        why += dw
    hosts = []
    for index in range(draw(st.integers(1, 4))):
        host, hv, hw = _host_entry(draw, index)
        hosts.append(host)
        verdicts += hv
        why += hw
    if hosts and draw(st.integers(0, 9)) == 7:
        hosts.append(dict(hosts[0]))  # a duplicate host
        verdicts.append("bad")
        why.append("duplicate")
    data["hosts"] = hosts
    files["cluster.yaml"] = _render(data, draw(st.integers(0, 2)))
    return Case("cluster", files, argv, _combine(verdicts), why)


@st.composite
def hostfile_cases(draw: st.DrawFn) -> Case:
    """A hostfile (named ``hostfile``, or read as one by its content), with a valid job."""
    name = draw(st.sampled_from(["hostfile", "lab.txt", "hosts"]))
    files: dict[str, Any] = {"train.py": "print('hi')\n", "job.yaml": "script: train.py\n"}
    argv = ["launch", "job.yaml", "--cluster", name, "--dry-run"]
    lines: list[str] = []
    verdicts: list[Verdict] = []
    seen: set[str] = set()
    for index in range(draw(st.integers(1, 5))):
        kind = draw(st.integers(0, 12))
        host = f"gpu{index}.lab" if kind != 1 else f"10.0.0.{index + 1}"
        if kind <= 6:
            slots = draw(st.integers(1, 1024))
            forms = [f"{host} slots={slots}", host, f"{host} slots={slots} max_slots=8  # c"]
            lines.append(draw(st.sampled_from(forms)))
            verdicts.append("ok")
            seen.add(host)
        elif kind == 7:
            lines.append(draw(st.sampled_from(["# comment", "", "   "])))
        else:
            bad = draw(
                st.sampled_from(
                    [
                        f"{host} slots=0",
                        f"{host} slots=99999",
                        f"{host} slots=9223372036854775808",
                        f"{host}:4",
                        f"-{host}",
                        f"{host}/x",
                        f"{host} slot=2",
                        f"{host} cpus=1",
                        f"h\u00e9st{index}",
                        f"{host}\x1b[31m",
                        f"{host}\x00",
                        f"{host} slots=1\x0b",
                        f"{host} slots=\ud800",
                        "\x7f\x7f",
                        f"{host} slots=1.5",
                        f"{host} slots=true",
                        f"{host} {host}",
                    ]
                )
            )
            lines.append(bad)
            verdicts.append("bad")
    if seen and draw(st.integers(0, 9)) == 7:
        lines.append(next(iter(seen)).upper())
        verdicts.append("bad")
    text = "\n".join(lines) + "\n"
    if "ok" not in verdicts and "bad" not in verdicts:
        verdicts.append("bad")  # no hosts at all
    if name == "hosts" and lines and not _first_line_is_hostfile(lines):
        verdicts.append("bad")  # read as YAML: not a mapping
    files[name] = text
    return Case("hostfile", files, argv, _combine(verdicts))


def _first_line_is_hostfile(lines: list[str]) -> bool:
    from dmlctl.spec.hostfile import is_hostfile

    return is_hostfile("hosts", "\n".join(lines))


# --------------------------------------------------------------------------- checking


class Hang(BaseException):
    """Raised by the alarm: the command ran past :data:`LIMIT_S`."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def ring(_signum: int, _frame: object) -> None:
        raise Hang()

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def materialize(case: Case, root: Path) -> None:
    """Write ``case.files`` under ``root`` (special kinds become real special files)."""
    for name, content in case.files.items():
        path = root / name
        if content == "fifo":
            os.mkfifo(path)
        elif content == "directory":
            path.mkdir()
        elif content == "devnull":
            path.symlink_to("/dev/null")
        elif content == "loop":
            path.symlink_to(path.name)
        elif content == "fifo-link":
            os.mkfifo(root / "real-fifo")
            path.symlink_to("real-fifo")
        elif content == "link-outside":
            outside = root.parent / f"{root.name}-outside.py"
            outside.write_text("print('outside')\n")
            path.symlink_to(outside)
        elif content == "missing":
            continue
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_bytes(content.encode("utf-8", "surrogatepass"))


@dataclass
class Outcome:
    code: int | None
    stdout: str
    stderr: str
    seconds: float
    hung: bool


def run_cli(argv: list[str], cwd: Path, home: Path) -> Outcome:
    """``dmlctl ARGV`` in this process, in ``cwd``, under the :data:`LIMIT_S` alarm."""
    import time

    from dmlctl.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    old_cwd = os.getcwd()
    old_home = os.environ.get("DMLCTL_HOME")
    os.environ["DMLCTL_HOME"] = str(home)
    start = time.monotonic()
    code: int | None = None
    hung = False
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _alarm(LIMIT_S):
            code = main(argv)
    except Hang:
        hung = True
    except BaseException as exc:  # anything escaping main is a traceback
        err.write(f"Traceback (escaped main): {type(exc).__name__}: {exc}\n")
    finally:
        os.chdir(old_cwd)
        if old_home is None:
            os.environ.pop("DMLCTL_HOME", None)
        else:
            os.environ["DMLCTL_HOME"] = old_home
    return Outcome(code, out.getvalue(), err.getvalue(), time.monotonic() - start, hung)


def _printable_plan(text: str) -> bool:
    return not any((ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in text)


def violations(case: Case, outcome: Outcome, home: Path, files: Mapping[str, str]) -> list[str]:
    """Every way ``outcome`` breaks the property (see the module docstring)."""
    found: list[str] = []
    if outcome.hung:
        return ["hang"]
    if "Traceback" in outcome.stderr or "Traceback" in outcome.stdout:
        found.append("traceback")
    if outcome.code == 3:
        found.append("exit 3")
    if (home / "runs").exists():
        found.append("run directory created")
    if outcome.code == 0:
        if case.verdict == "bad":
            found.append("garbage accepted")
        elif not _printable_plan(outcome.stdout):
            found.append("garbage accepted (control characters in the plan)")
    elif outcome.code == 2:
        if case.verdict == "ok":
            found.append("valid spec refused")
        lines = outcome.stderr.rstrip("\n").split("\n")
        for line in lines:
            if len(line) > MAX_LINE:
                found.append(f"error line of {len(line)} characters")
            if not any(line.startswith(f"dmlctl: {f}") for f in files.values()):
                found.append(f"error line names no spec file: {line[:80]!r}")
    elif outcome.code not in (3,):
        found.append(f"exit {outcome.code}")
    if outcome.seconds > LIMIT_S:
        found.append(f"took {outcome.seconds:.1f} s")
    return found


def check(case: Case, root: Path) -> list[str]:
    """Run ``case`` in a fresh directory under ``root``; its property violations."""
    import tempfile

    work = Path(tempfile.mkdtemp(dir=root))
    home = work / "home"
    job_dir = work / "job"
    job_dir.mkdir()
    materialize(case, job_dir)
    spec_files = {n: n for n in case.files if n.endswith((".yaml", "hostfile", ".txt", "hosts"))}
    outcome = run_cli(case.argv, job_dir, home)
    return violations(case, outcome, home, spec_files)


def describe_failure(case: Case, problems: list[str]) -> str:
    shown = {k: (v if len(str(v)) < 300 else f"{str(v)[:300]}...") for k, v in case.files.items()}
    return f"{problems} for {case.kind} case {case.verdict} {case.why}: {shown!r}"


if __name__ == "__main__":  # pragma: no cover - see tests/fuzz/run_long.py
    sys.exit("run tests/fuzz/run_long.py")
