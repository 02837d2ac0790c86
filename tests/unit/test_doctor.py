"""The preflight doctor: scripted hosts for every check, real processes for the scripts.

Scripted results are keyed by the exact argv the doctor sends, built with the same
helpers (:func:`probe_argv`, :func:`connect_argv`) the doctor uses. Scripted hosts are
asked about :data:`NEEDED`; the real-process tests ask what the ranks really import.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import io
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet
from rich.console import Console

from dmlctl.provision import probe
from dmlctl.provision.doctor import CHECKS, CONNECT_TIMEOUT, DoctorReport, run_doctor
from dmlctl.provision.doctor_view import doctor_json, render_doctor
from dmlctl.provision.probe import PROBE, PROBE_KEYS, connect_argv, probe_argv, read_probe
from dmlctl.provision.requirements import Needed, data_plane_requirements
from dmlctl.spec.models import ResolvedHost
from dmlctl.transport.base import Command, Outcome, Transport
from dmlctl.transport.fake import ScriptedTransport
from dmlctl.transport.local import LocalTransport

NOW = 1_700_000_000.0
PORT = 29511
GIB = 1 << 30
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's 3.11.2: no torch, no pydantic
NO_LISTENER = "skipped: node-a has no rendezvous listener"
NEEDED = (
    Needed("numpy", ("numpy",), SpecifierSet(">=1.22")),
    Needed("pydantic", ("pydantic",), SpecifierSet(">=2.5,<3")),
    Needed("PyYAML", ("yaml",), SpecifierSet(">=6")),  # import name != distribution name
    Needed("torch", ("torch",), SpecifierSet(">=2.4")),
)
ASKED = [("numpy", "numpy"), ("pydantic", "pydantic"), ("yaml", "PyYAML"), ("torch", "torch")]
VERSIONS = {"numpy": "2.4.6", "pydantic": "2.13.4", "yaml": "6.0.3", "torch": "2.13.0+cpu"}


def clock() -> float:
    return NOW


def host(name: str, address: str | None = None, python: str = "python3", **kw: Any) -> ResolvedHost:
    values: dict[str, Any] = {
        "name": name,
        "address": address or f"10.0.0.{ord(name[-1]) - 96}",
        "port": 22,
        "user": None,
        "identity_file": None,
        "slots": 1,
        "workdir": "~/.dmlctl/work",
        "python": python,
        "env": {},
        "is_local": False,
    }
    values.update(kw)
    return ResolvedHost(**values)


def packages(**versions: str | None) -> dict[str, Any]:
    """The probe's ``packages`` answer for :data:`ASKED`: every module importable with
    its version in :data:`VERSIONS` unless ``versions`` says (None: not installed)."""
    out = {}
    for module, dist in ASKED:
        version = versions.get(module, VERSIONS[module])
        error = None if version is not None else f"No module named {module!r}"
        out[module] = {"dist": dist, "version": version, "error": error}
    return out


def facts(**overrides: Any) -> str:
    """A healthy host's probe answer, as the probe prints it."""
    out: dict[str, Any] = {
        "python": "3.11.7",
        "platform": "Linux-6.1-x86_64",
        "torch": "2.13.0+cpu",
        "torch_error": None,
        "cuda": False,
        "gpus": 0,
        "cuda_version": None,
        "nccl": None,
        "driver": None,
        "packages": packages(),
        "workdir": "/home/u/.dmlctl/work",
        "disk_free": 50 * GIB,
        "disk_error": None,
        "port": None,
        "port_free": None,
        "port_error": None,
        "time": NOW,
        "elapsed": 0.01,
    }
    out.update(overrides)
    return json.dumps(out) + "\n"


A, B, C = host("node-a"), host("node-b"), host("node-c")


def cluster(
    *,
    answers: dict[str, tuple[int, str, str]] | None = None,
    connects: dict[str, tuple[int, str, str]] | None = None,
    hosts: Sequence[ResolvedHost] = (A, B, C),
    listener: Sequence[str] = ("ready",),
    timeout: float = 30.0,
) -> dict[str, ScriptedTransport]:
    """Scripted transports: every host healthy unless ``answers``/``connects`` say."""
    answers, connects = answers or {}, connects or {}
    first, wait = hosts[0], min(CONNECT_TIMEOUT, timeout)
    out = {}
    for h in hosts:
        port = PORT if h is first else None
        default = facts(port=PORT, port_free=True) if port else facts()
        results = {tuple(probe_argv(h, port, ASKED)): answers.get(h.name, (0, default, ""))}
        if h is not first:
            argv = tuple(connect_argv(h, first.address, PORT, wait))
            results[argv] = connects.get(h.name, (0, "ok\n", ""))
        out[h.name] = ScriptedTransport(h.name, listener, hang=True, results=results)
    return out


def doctor(
    transports: dict[str, ScriptedTransport] | dict[str, Transport],
    hosts: Sequence[ResolvedHost] = (A, B, C),
    **kw: Any,
) -> DoctorReport:
    kw.setdefault("clock", clock)
    kw.setdefault("packages", NEEDED)
    return run_doctor(hosts, transports, rdzv_port=PORT, **kw)


def detail(report: DoctorReport, host_name: str, check: str) -> str:
    h = next(h for h in report.hosts if h.host == host_name)
    found = h.check(check)
    assert found is not None, f"{host_name} has no {check!r} check"
    return found.detail


def rendered(report: DoctorReport) -> str:
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(render_doctor(report))
    return console.file.getvalue()  # type: ignore[attr-defined,no-any-return]


# ------------------------------------------------------------------ scripted hosts


def test_a_gpu_host_shows_its_cuda_nccl_and_driver_versions_and_cpu_hosts_no_such_column() -> None:
    gpu = facts(cuda=True, gpus=8, cuda_version="13.0", nccl="2.27.7", driver="580.159.04")
    report = doctor(cluster(answers={"node-b": (0, gpu, "")}))
    lines = rendered(report).splitlines()
    (b_row,) = [line for line in lines if line.startswith("node-b")]
    assert "8  CUDA 13.0, NCCL 2.27.7, driver 580.159.04" in b_row
    (a_row,) = [line for line in lines if line.startswith("node-a")]
    assert " 0  -  " in a_row
    assert "cuda" not in rendered(doctor(cluster())).splitlines()[0]


def test_all_good() -> None:
    ts = cluster()
    report = doctor(ts)
    assert report.ok and report.failures() == ()
    assert [h.host for h in report.hosts] == ["node-a", "node-b", "node-c"]
    first, other = report.hosts[0], report.hosts[1]
    assert [c.name for c in first.checks] == [c for c in CHECKS if c != "rendezvous reachable"]
    assert [c.name for c in other.checks] == [c for c in CHECKS if c != "rendezvous port"]
    assert detail(report, "node-b", "rendezvous reachable") == f"10.0.0.1:{PORT} reachable"
    assert detail(report, "node-a", "rendezvous port") == f"port {PORT} is free"
    assert detail(report, "node-b", "packages") == (
        "numpy 2.4.6, pydantic 2.13.4, PyYAML 6.0.3, torch 2.13.0+cpu"
    )
    # One listener on the first host, killed at the end; probes asked each host once.
    (proc,) = ts["node-a"].processes
    assert proc.argv == tuple(probe.listener_argv(A, PORT, 35.0, "10.0.0.1")) and proc.killed
    assert [r["argv"][2] for r in ts["node-a"].runs] == [PROBE]
    assert [r["argv"][2] for r in ts["node-b"].runs] == [PROBE, probe.CONNECT]
    text = rendered(report)
    assert "all 3 hosts ready" in text and "2.13.0+cpu" in text and "50.0 GiB" in text
    js = doctor_json(report)
    assert js["ok"] is True and js["failed"] == 0 and len(js["hosts"][1]["checks"]) == 8
    json.dumps(js)  # serialisable as is


def test_unreachable_and_other_torch_both_reported() -> None:
    ts = cluster(
        answers={
            "node-b": (255, "", "connection to 10.0.0.2:22 refused"),
            "node-c": (0, facts(torch="2.4.1+cu121"), ""),
        }
    )
    report = doctor(ts)
    assert not report.ok
    assert [h.host for h in report.failures()] == ["node-b", "node-c"]
    b, c = report.hosts[1], report.hosts[2]
    assert [(x.name, x.detail) for x in b.failures()] == [
        ("reachable", "connection to 10.0.0.2:22 refused")
    ]
    assert all(x.skipped and x.detail == "skipped: unreachable" for x in b.checks[1:])
    assert [(x.name, x.detail) for x in c.failures()] == [
        ("versions", "torch 2.4.1+cu121 here, 2.13.0+cpu on node-a")
    ]
    # The unreachable host is not asked to connect to the rendezvous listener.
    assert len(ts["node-b"].runs) == 1 and len(ts["node-c"].runs) == 2
    text = rendered(report)
    assert "2 of 3 hosts failed" in text and "✗ reachable: connection to 10.0.0.2:22" in text
    assert "✗ versions: torch 2.4.1+cu121 here" in text


def test_versions_flag_the_odd_one_out_only() -> None:
    ts = cluster(answers={"node-a": (0, facts(python="3.10.12", port=PORT, port_free=True), "")})
    report = doctor(ts)
    assert [h.host for h in report.failures()] == ["node-a"]
    assert detail(report, "node-a", "versions") == "python 3.10.12 here, 3.11.7 on node-b"
    # cpu and cuda builds of one torch release, and pydantic minors, are compatible
    odd = facts(torch="2.13.0+cu128", packages=packages(pydantic="2.5.0"))
    assert doctor(cluster(answers={"node-c": (0, odd, "")})).ok
    # pydantic's major is compared too, read from the packages answer
    odd = facts(packages=packages(pydantic="1.10.2"))
    report = doctor(cluster(answers={"node-c": (0, odd, "")}))
    assert detail(report, "node-c", "versions") == "pydantic 1.10.2 here, 2.13.4 on node-a"


def test_host_key_refusal_lands_in_reachable_with_fingerprint() -> None:
    why = (
        "host key for 127.0.0.3:2222 is not known (ssh-ed25519 SHA256:abc); "
        "rerun with --accept-new-host-keys to trust it"
    )
    report = doctor(cluster(answers={"node-c": (255, "", why)}))
    assert detail(report, "node-c", "reachable") == why


@pytest.mark.parametrize(
    ("overrides", "check", "expected"),
    [
        ({"python": "3.8.10"}, "python", "3.8.10, need >= 3.10"),
        (
            {"packages": packages(numpy=None)},
            "packages",
            "numpy not importable: No module named 'numpy'",
        ),
        (
            {"packages": packages(pydantic="1.10.2")},
            "packages",
            "pydantic 1.10.2 does not satisfy >=2.5,<3",
        ),
        (
            {"packages": packages(numpy=None, pydantic="1.10.2", yaml=None)},
            "packages",
            "numpy not importable: No module named 'numpy'; pydantic 1.10.2 does not satisfy "
            ">=2.5,<3; PyYAML not importable: No module named 'yaml'",
        ),
        (
            {"torch": "2.3.1", "packages": packages(torch="2.3.1")},
            "packages",
            "torch 2.3.1 does not satisfy >=2.4",
        ),
        (
            {"torch": None, "torch_error": "ModuleNotFoundError: No module named 'torch'"},
            "torch",
            "not importable: ModuleNotFoundError: No module named 'torch'",
        ),
        ({"disk_free": GIB // 2}, "disk", "0.5 GiB free in /home/u/.dmlctl/work, need 1.0 GiB"),
        (
            {"disk_free": None, "disk_error": "PermissionError: [Errno 13] denied"},
            "disk",
            "work dir /home/u/.dmlctl/work: PermissionError: [Errno 13] denied",
        ),
        ({"time": NOW + 10.0}, "clock", "10.0 s ahead of this machine (at least 10.0 s; max 2 s)"),
        ({"time": NOW - 3.0}, "clock", "3.0 s behind this machine (at least 3.0 s; max 2 s)"),
    ],
)
def test_one_bad_host(overrides: dict[str, Any], check: str, expected: str) -> None:
    report = doctor(cluster(answers={"node-b": (0, facts(**overrides), "")}))
    (failed,) = report.failures()
    assert failed.host == "node-b"
    assert (failed.failures()[0].name, failed.failures()[0].detail) == (check, expected)


def test_host_without_numpy_fails_packages_and_says_so_everywhere() -> None:
    report = doctor(cluster(answers={"node-c": (0, facts(packages=packages(numpy=None)), "")}))
    assert [(c.name, c.detail) for c in report.hosts[2].failures()] == [
        ("packages", "numpy not importable: No module named 'numpy'")
    ]
    assert "✗ packages: numpy not importable: No module named 'numpy'" in rendered(report)
    checks = doctor_json(report)["hosts"][2]["checks"]
    assert {
        "name": "packages",
        "ok": False,
        "skipped": False,
        "detail": "numpy not importable: No module named 'numpy'",
    } in checks


def test_packages_without_a_known_version_or_bound_pass() -> None:
    # No version to compare (no metadata, no __version__): the import is what counts.
    report = doctor(cluster(answers={"node-b": (0, facts(packages=packages(yaml="")), "")}))
    assert report.ok
    assert "PyYAML (version unknown)" in detail(report, "node-b", "packages")
    # No dmlctl metadata: every module is needed, in any version.
    unbounded = tuple(Needed(n.dist, n.modules, SpecifierSet()) for n in NEEDED)
    old = facts(packages=packages(pydantic="1.10.2", torch="1.0"))
    report = doctor(cluster(answers={"node-b": (0, old, "")}), packages=unbounded)
    assert detail(report, "node-b", "packages").startswith("numpy 2.4.6, pydantic 1.10.2")


def test_the_default_packages_are_what_the_ranks_import() -> None:
    needed = data_plane_requirements()
    asked = [(m, n.dist) for n in needed for m in n.modules]
    answer = {m: {"dist": d, "version": None, "error": None} for m, d in asked}
    argv = tuple(probe_argv(A, PORT, asked))
    healthy = facts(packages=answer, port=PORT, port_free=True)
    t = ScriptedTransport("node-a", results={argv: (0, healthy, "")})
    report = run_doctor([A], {"node-a": t}, rdzv_port=PORT, clock=clock)
    assert [r["argv"] for r in t.runs] == [argv]
    assert {"torch", "pydantic", "numpy"} <= {n.name for n in needed}
    assert report.ok, report.failures()


def test_scripts_run_on_python_3_8() -> None:
    for script in (PROBE, probe.LISTENER, probe.CONNECT):
        ast.parse(script, feature_version=(3, 8))


def test_clock_skew_is_measured_against_the_request_window() -> None:
    # Request sent at 100, reply at 104; the probe ran 3 s, so it answered in [103, 104].
    ticks = iter([100.0, 104.0])
    answer = facts(time=103.5, elapsed=3.0, port=PORT, port_free=True)
    t = ScriptedTransport("node-a", results={tuple(probe_argv(A, PORT, ASKED)): (0, answer, "")})
    report = doctor({"node-a": t}, hosts=[A], clock=lambda: next(ticks))
    assert report.ok
    assert report.hosts[0].facts["clock_skew"] == 0.0
    assert report.hosts[0].facts["clock_uncertainty"] == 0.5


def test_a_late_answer_widens_the_clock_window_and_fails_only_a_certain_skew() -> None:
    """A loaded host: sent at 100, the reply at 105 after a probe of 0.5 s, so the
    answer lies in [100.5, 105]. Its time 104.9 is 2.15 ± 2.25 s from the middle: the
    clocks may agree, and the check passes (the same host, 2.1 s "ahead", once failed)."""
    answer = facts(time=104.9, elapsed=0.5, port=PORT, port_free=True)
    for reply_at, ok in ((105.0, True), (101.0, False)):
        t = ScriptedTransport(
            "node-a", results={tuple(probe_argv(A, PORT, ASKED)): (0, answer, "")}
        )
        report = doctor({"node-a": t}, hosts=[A], clock=iter([100.0, reply_at]).__next__)
        assert report.ok == ok, report.failures()


def test_probe_that_cannot_run() -> None:
    report = doctor(cluster(answers={"node-c": (127, "", "bash: python3: command not found")}))
    c = report.hosts[2]
    assert [(x.name, x.detail) for x in c.failures()] == [
        ("python", "python3 exited 127: bash: python3: command not found")
    ]
    assert c.check("reachable").ok  # type: ignore[union-attr]
    assert all(x.detail == "skipped: probe failed" for x in c.checks[2:])


def test_rendezvous_port_taken_on_first_host() -> None:
    busy_err = "OSError: [Errno 98] Address already in use"
    busy = facts(port=PORT, port_free=False, port_error=busy_err)
    ts = cluster(answers={"node-a": (0, busy, "")})
    report = doctor(ts)
    assert [h.host for h in report.failures()] == ["node-a"]
    assert detail(report, "node-a", "rendezvous port") == f"port {PORT} is not free: {busy_err}"
    assert detail(report, "node-b", "rendezvous reachable") == NO_LISTENER
    assert ts["node-a"].processes == []


def test_rendezvous_unreachable_from_one_host() -> None:
    refused = (1, "cannot connect to 10.0.0.1:29511: [Errno 111] Connection refused\n", "")
    report = doctor(cluster(connects={"node-c": refused}))
    assert [h.host for h in report.failures()] == ["node-c"]
    assert detail(report, "node-c", "rendezvous reachable").endswith("Connection refused")


def test_listener_that_never_gets_ready() -> None:
    ts = cluster(listener=["something else"], timeout=0.5)
    start = time.monotonic()
    report = doctor(ts, timeout=0.5)
    assert time.monotonic() - start < 2.0
    assert detail(report, "node-a", "rendezvous port").startswith("listener did not start")
    assert detail(report, "node-b", "rendezvous reachable") == NO_LISTENER
    assert ts["node-a"].process.killed


class HangingTransport(Transport):
    """A host whose commands never finish (until released)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.release = threading.Event()

    def execute(self, command: Command) -> Outcome:
        self.release.wait(60)
        return 124, "", "released"

    def start(self, argv: Sequence[str], *, cwd: str | None = None) -> Any:
        raise AssertionError("a hung host is not asked to listen")


def test_hanging_host_is_timed_out_and_does_not_hold_the_others() -> None:
    ts: dict[str, Any] = cluster(timeout=1.0)
    hung = ts["node-b"] = HangingTransport("node-b")
    try:
        start = time.monotonic()
        report = doctor(ts, timeout=1.0)
        took = time.monotonic() - start
    finally:
        hung.release.set()
    assert 1.0 <= took < 1.5, took
    assert [h.host for h in report.failures()] == ["node-b"]
    assert detail(report, "node-b", "reachable") == "timed out after 1 s"
    assert detail(report, "node-c", "rendezvous reachable") == f"10.0.0.1:{PORT} reachable"


def test_no_hosts_and_missing_transports() -> None:
    assert doctor({}, hosts=[]).ok
    with pytest.raises(ValueError, match="node-b"):
        doctor({"node-a": ScriptedTransport("node-a")}, hosts=[A, B])


def test_read_probe_ignores_noise() -> None:
    out = "Welcome to node-a!\n" + facts() + "{not json\n"
    parsed = read_probe(out, NOW, NOW)
    assert parsed is not None and parsed["torch"] == "2.13.0+cpu"
    assert read_probe("no json here\n", NOW, NOW) is None


# ------------------------------------------------------------------ real processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_probe(
    python: str,
    workdir: Path,
    port: int | None,
    asked: Sequence[tuple[str, str]] = (),
    reuse: bool = False,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    h = host("local", python=python, workdir=str(workdir))
    argv = probe_argv(h, port, asked, reuse_torch=reuse)
    if env is not None:
        argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
    res = LocalTransport("local").run(argv, timeout=60)
    assert res.exit_code == 0, res.stderr
    parsed = read_probe(res.stdout, NOW, NOW)
    assert parsed is not None and set(PROBE_KEYS) <= set(parsed)
    return parsed


@pytest.mark.integration
def test_a_launchs_probe_reuses_torchs_facts_until_what_they_depend_on_changes(
    tmp_path: Path,
) -> None:
    """The facts are kept in the user's cache ($XDG_CACHE_HOME here), for any workdir."""
    work, asked = tmp_path / "work", [("torch", "torch")]
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = run_probe(sys.executable, work, None, asked, reuse=True, env=env)
    again = run_probe(sys.executable, tmp_path / "other", None, asked, reuse=True, env=env)
    keys = ("torch", "cuda", "gpus", "cuda_version", "nccl")
    assert not first["torch_reused"] and again["torch_reused"]
    assert {k: again[k] for k in keys} == {k: first[k] for k in keys}
    assert again["packages"]["torch"] == first["packages"]["torch"]
    assert again["elapsed"] < first["elapsed"]  # no torch import
    (kept,) = (tmp_path / "cache" / "dmlctl").iterdir()
    assert kept.name.startswith("probe-torch-") and kept.suffix == ".json", kept
    assert not list(work.glob(".probe*"))  # nothing of the probe's in the workdir
    hidden = {**env, "CUDA_VISIBLE_DEVICES": ""}
    other = run_probe(sys.executable, work, None, asked, reuse=True, env=hidden)
    assert not other["torch_reused"]  # what CUDA sees changed: imported again
    doctor = run_probe(sys.executable, work, None, asked, env=env)
    assert not doctor["torch_reused"]  # the doctor's probe imports torch


@pytest.mark.integration
def test_probe_for_real_with_torch(tmp_path: Path) -> None:
    port = free_port()
    asked = [("torch", "torch"), ("yaml", "PyYAML"), ("dmlctl_nothing", "dmlctl-nothing")]
    f = run_probe(sys.executable, tmp_path / "new" / "work", port, asked)
    import torch  # the test may; the doctor never does

    assert f["torch"] == torch.__version__ and f["torch_error"] is None
    assert f["python"] == ".".join(map(str, sys.version_info[:3]))
    assert f["gpus"] == torch.cuda.device_count()
    assert f["packages"] == {
        "torch": {"dist": "torch", "version": md.version("torch"), "error": None},
        "yaml": {"dist": "PyYAML", "version": md.version("PyYAML"), "error": None},
        "dmlctl_nothing": {
            "dist": "dmlctl-nothing",
            "version": None,
            "error": "No module named 'dmlctl_nothing'",
        },
    }
    assert (tmp_path / "new" / "work").is_dir() and f["disk_free"] > 0
    assert f["port"] == port and f["port_free"] is True
    assert abs(f["time"] - time.time()) < 60


@pytest.mark.integration
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs Debian's python3")
def test_probe_for_real_without_torch(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        f = run_probe(SYSTEM_PYTHON, tmp_path, port, [("pydantic", "pydantic")])
    assert f["torch"] is None and "No module named 'torch'" in f["torch_error"]
    assert f["gpus"] == 0
    assert f["packages"]["pydantic"]["error"] == "No module named 'pydantic'"
    assert f["port_free"] is False and "in use" in f["port_error"]


@pytest.mark.integration
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs Debian's python3")
def test_doctor_for_real_on_loopback(tmp_path: Path) -> None:
    """Two 'hosts' on 127.0.0.1: the real listener/connect pair, and a real mismatch."""
    a = host("node-a", "127.0.0.1", sys.executable, workdir=str(tmp_path / "a"))
    b = host("node-b", "127.0.0.1", SYSTEM_PYTHON, workdir=str(tmp_path / "b"))
    port = free_port()
    start = time.monotonic()
    report = run_doctor(
        [a, b],
        {"node-a": LocalTransport("node-a"), "node-b": LocalTransport("node-b")},
        rdzv_port=port,
        timeout=30,
    )
    took = time.monotonic() - start
    assert [c.name for c in report.hosts[0].failures()] == []
    assert {c.name for c in report.hosts[1].failures()} == {"torch", "packages"}
    missing = detail(report, "node-b", "packages")
    assert "pydantic not importable: No module named 'pydantic'" in missing
    assert "torch not importable: No module named 'torch'" in missing
    assert detail(report, "node-b", "rendezvous reachable") == f"127.0.0.1:{port} reachable"
    assert abs(report.hosts[1].facts["clock_skew"]) < 0.5
    assert took < 20, took
    with socket.socket() as s:  # the listener is gone
        assert s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.integration
def test_connect_probe_for_real_against_nothing() -> None:
    h = host("local", python=sys.executable)
    res = LocalTransport("local").run(connect_argv(h, "127.0.0.1", free_port(), 2.0), timeout=10)
    assert res.exit_code == 1 and "cannot connect to 127.0.0.1" in res.stdout
