"""The preflight doctor: probe every host at once and report every failure at once.

:func:`run_doctor` promises:

* every host is probed in parallel, one thread per host; every wait has a deadline,
  so a host that hangs is reported as timed out after ``timeout`` seconds and never
  makes the others wait longer; the call never raises for a host's sake;
* each host gets the checks in :data:`CHECKS` (``rendezvous port`` on the first
  host, ``rendezvous reachable`` on the others): a host that cannot be reached fails
  ``reachable`` only, its other checks are skipped (``skipped=True``, not failures);
* ``packages`` imports, on the host's Python, exactly what the ranks will import
  (:func:`~dmlctl.provision.requirements.data_plane_requirements`, derived from the
  code and dmlctl's declared dependencies) and fails naming every distribution that
  is missing or outside its declared range;
* with several hosts, a listener is started on the first host's rendezvous port and
  every other host connects to it (the address the launch plan will use), in
  parallel; waiting for the listener and for the connects each take at most
  ``timeout``; the listener is stopped (stdin closed, killed, reaped) before returning.

Rendering (:func:`render_doctor`) and :func:`doctor_json` are pure.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dmlctl.provision import probe
from dmlctl.provision.requirements import Needed, data_plane_requirements
from dmlctl.text import host_port
from dmlctl.transport import network_address
from dmlctl.transport.base import Transport

if TYPE_CHECKING:
    from dmlctl.spec.models import ResolvedHost

REACHABLE, PYTHON, TORCH, PACKAGES = "reachable", "python", "torch", "packages"
VERSIONS, DISK, CLOCK = "versions", "disk", "clock"
RDZV_PORT, RDZV_REACHABLE = "rendezvous port", "rendezvous reachable"
CHECKS = (REACHABLE, PYTHON, TORCH, PACKAGES, VERSIONS, DISK, CLOCK, RDZV_PORT, RDZV_REACHABLE)
"""Every check name, in report order."""
MIN_PYTHON = (3, 10)
CONNECT_TIMEOUT = 5.0
"""Socket timeout of one connect probe (capped by the doctor's ``timeout``)."""


@dataclass(frozen=True)
class Check:
    """One check of one host; a skipped one (could not run, ``ok`` False) is no failure."""

    name: str
    ok: bool
    detail: str
    skipped: bool = False


@dataclass(frozen=True)
class HostReport:
    """Every check of one host, in :data:`CHECKS` order, and what the probe found."""

    host: str
    address: str
    checks: tuple[Check, ...]
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No check failed (a skipped check is not a failure)."""
        return not self.failures()

    def failures(self) -> tuple[Check, ...]:
        """The checks that failed (skipped checks are not failures)."""
        return tuple(c for c in self.checks if not c.ok and not c.skipped)

    def check(self, name: str) -> Check | None:
        """The check called ``name``, or None if this host has none."""
        return next((c for c in self.checks if c.name == name), None)


@dataclass(frozen=True)
class DoctorReport:
    """One :class:`HostReport` per host, in cluster order."""

    hosts: tuple[HostReport, ...]

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    def failures(self) -> tuple[HostReport, ...]:
        """The hosts that failed, in cluster order (each: :meth:`HostReport.failures`)."""
        return tuple(h for h in self.hosts if not h.ok)


def _last_line(*texts: str) -> str:
    lines = [ln.strip() for text in texts for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def gib(n: float) -> str:
    """``n`` bytes in GiB, one decimal."""
    return f"{n / (1 << 30):.1f} GiB"


def _probe_checks(
    h: ResolvedHost,
    a: probe.Answer | str,
    needed: Sequence[Needed],
    *,
    first: bool,
    min_free: int,
    max_skew: float,
) -> tuple[dict[str, Check], dict[str, Any] | None, str | None]:
    """(checks, probe facts or None, why the other checks are skipped or None)."""
    if isinstance(a, str):
        return {REACHABLE: Check(REACHABLE, False, a)}, None, "unreachable"
    r = a.result
    if r.exit_code in (124, 255):
        why = r.stderr.strip() or f"unreachable (exit code {r.exit_code})"
        return {REACHABLE: Check(REACHABLE, False, why)}, None, "unreachable"
    checks = {REACHABLE: Check(REACHABLE, True, f"answered in {r.duration:.2f} s")}
    if (f := probe.read_probe(r.stdout, a.sent, a.received)) is not None:
        checks.update(_host_checks(f, first=first, min_free=min_free, max_skew=max_skew))
        checks[PACKAGES] = _packages_check(f.get("packages") or {}, needed)
        return checks, f, None
    why = f"{h.python} exited {r.exit_code}: {_last_line(r.stderr, r.stdout)}"
    checks[PYTHON] = Check(PYTHON, False, why)
    return checks, None, "probe failed"


def _check(name: str, ok: bool, good: str, bad: str) -> Check:
    return Check(name, ok, good if ok else bad)


def _host_checks(
    f: Mapping[str, Any], *, first: bool, min_free: int, max_skew: float
) -> dict[str, Check]:
    py, free, skew = str(f["python"]), f.get("disk_free"), float(f["clock_skew"])
    where = "ahead of" if skew > 0 else "behind"
    # Only a skew beyond doubt fails: a loaded host answers late, which widens the
    # window the answer's time is known to lie in, not the skew.
    least = max(0.0, abs(skew) - float(f.get("clock_uncertainty") or 0.0))
    c = [
        _check(PYTHON, tuple(map(int, py.split(".")[:2])) >= MIN_PYTHON, py, f"{py}, need >= 3.10"),
        _check(
            TORCH,
            f.get("torch") is not None,
            str(f.get("torch")),
            f"not importable: {f.get('torch_error')}",
        ),
        Check(DISK, False, f"work dir {f.get('workdir')}: {f.get('disk_error')}")
        if free is None
        else _check(
            DISK,
            free >= min_free,
            f"{gib(free)} free in {f['workdir']}",
            f"{gib(free)} free in {f['workdir']}, need {gib(min_free)}",
        ),
        _check(
            CLOCK,
            least <= max_skew,
            f"{skew:+.3f} s (±{f['clock_uncertainty']:.3f})",
            f"{abs(skew):.1f} s {where} this machine (at least {least:.1f} s; max {max_skew:g} s)",
        ),
    ]
    if first:
        port = f.get("port")
        c.append(
            _check(
                RDZV_PORT,
                bool(f.get("port_free")),
                f"port {port} is free",
                f"port {port} is not free: {f.get('port_error')}",
            )
        )
    return {check.name: check for check in c}


def _packages_check(found: Mapping[str, Any], needed: Sequence[Needed]) -> Check:
    """Every distribution in ``needed`` importable (all its modules) and in range;
    ``found`` is the probe's ``packages`` answer."""
    problems: list[str] = []
    have: list[str] = []
    for n in needed:
        answers = [found.get(m) or {"error": "not probed"} for m in n.modules]
        errors = [a["error"] for a in answers if a.get("error")]
        version = next((a["version"] for a in answers if a.get("version")), None)
        if errors:
            problems.extend(f"{n.dist} not importable: {e}" for e in errors)
        elif version is not None and not n.allows(version):
            problems.append(f"{n.dist} {version} does not satisfy {n.range}")
        else:
            have.append(f"{n.dist} {version or '(version unknown)'}")
    if problems:
        return Check(PACKAGES, False, "; ".join(problems))
    return Check(PACKAGES, True, ", ".join(have) or "none needed")


def _package_version(name: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda f: ((f.get("packages") or {}).get(name) or {}).get("version")


_COMPARED: tuple[tuple[str, Callable[[Mapping[str, Any]], Any], Callable[[str], str]], ...] = (
    ("python", lambda f: f.get("python"), lambda v: ".".join(v.split(".")[:2])),
    # cpu and cuda builds of one release interoperate
    ("torch", lambda f: f.get("torch"), lambda v: v.split("+")[0]),
    ("pydantic", _package_version("pydantic"), lambda v: v.split(".")[0]),
)


def _version_checks(facts: Mapping[str, Mapping[str, Any]]) -> dict[str, Check]:
    """Flags the odd ones out: hosts whose python major.minor, torch release or pydantic
    major differs from the most common one (ties: the earliest host's)."""
    problems: dict[str, list[str]] = {h: [] for h in facts}
    for key, get, norm in _COMPARED:
        have = {h: str(get(f)) for h, f in facts.items() if get(f) is not None}
        counts = Counter(norm(v) for v in have.values())
        best = max(counts.values(), default=0)
        ref = next((h for h, v in have.items() if counts[norm(v)] == best), "")
        for h, v in have.items():
            if norm(v) != norm(have[ref]):
                problems[h].append(f"{key} {v} here, {have[ref]} on {ref}")
    same = "same python, torch and pydantic on all hosts" if len(facts) > 1 else "one host"
    return {h: Check(VERSIONS, not p, "; ".join(p) or same) for h, p in problems.items()}


def _rendezvous(
    first: ResolvedHost,
    others: Sequence[ResolvedHost],
    transports: Mapping[str, Transport],
    port: int,
    timeout: float,
    clock: Callable[[], float],
) -> tuple[Check | None, dict[str, Check]]:
    """(a failed check replacing the first host's port check, or None; others' checks)."""
    address = network_address(transports[first.name], first.address)
    try:
        argv = probe.listener_argv(first, port, timeout + 5, address)
        proc = transports[first.name].start(argv)
    except Exception as e:
        return Check(RDZV_PORT, False, f"cannot start a listener: {e}"), {}
    try:
        if not probe.wait_ready(proc, timeout):
            why = _last_line(*proc.stderr_tail(), "no 'ready' from the listener")
            return Check(RDZV_PORT, False, f"listener did not start: {why}"), {}
        wait = min(CONNECT_TIMEOUT, timeout)
        calls = {
            h.name: (transports[h.name], probe.connect_argv(h, address, port, wait)) for h in others
        }
        answers = probe.fan_out(calls, timeout=timeout, clock=clock)
    finally:  # EOF on stdin ends the listener where kill() cannot reach it (SSH)
        proc.close_stdin()
        proc.kill()
        proc.wait(min(timeout, 5.0))  # the port is free again before launch binds it
    reached = f"{host_port(address, port)} reachable"
    return None, {
        name: Check(RDZV_REACHABLE, False, a)
        if isinstance(a, str)
        else _check(
            RDZV_REACHABLE,
            a.result.ok and a.result.stdout.strip() == "ok",
            reached,
            _last_line(a.result.stdout, a.result.stderr),
        )
        for name, a in answers.items()
    }


def run_doctor(
    hosts: Sequence[ResolvedHost],
    transports: Mapping[str, Transport],
    *,
    rdzv_port: int,
    timeout: float = 30.0,
    min_free_bytes: int = 1 << 30,
    max_clock_skew: float = 2.0,
    clock: Callable[[], float] = time.time,
    packages: Sequence[Needed] | None = None,
    reuse_torch: bool = False,
) -> DoctorReport:
    """Check every host (see the module promises); ``transports`` maps host name to
    transport. Clock skew is ``remote time - midpoint`` of the window in which the
    probe can have answered (after its own run time, before its reply arrived).
    ``packages``: what the ``packages`` check asks for (default: what the ranks import,
    :func:`~dmlctl.provision.requirements.data_plane_requirements`). ``reuse_torch``:
    a host may answer torch's facts from its previous probe (see
    :func:`~dmlctl.provision.probe.probe_argv`)."""
    if missing := [h.name for h in hosts if h.name not in transports]:
        raise ValueError(f"no transport for hosts {missing}")
    if not hosts:
        return DoctorReport(())
    needed = data_plane_requirements() if packages is None else tuple(packages)
    asked = [(m, n.dist) for n in needed for m in n.modules]
    first = hosts[0]
    calls = {
        h.name: (
            transports[h.name],
            probe.probe_argv(h, rdzv_port if h is first else None, asked, reuse_torch=reuse_torch),
        )
        for h in hosts
    }
    answers = probe.fan_out(calls, timeout=timeout, clock=clock)
    checks: dict[str, dict[str, Check]] = {}
    facts: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for h in hosts:
        checks[h.name], found, why = _probe_checks(
            h,
            answers[h.name],
            needed,
            first=h is first,
            min_free=min_free_bytes,
            max_skew=max_clock_skew,
        )
        facts.update({h.name: found} if found is not None else {})
        skipped.update({h.name: why} if why is not None else {})
    for name, check in _version_checks(facts).items():
        checks[name][VERSIONS] = check
    others = [h for h in hosts[1:] if h.name in facts]
    port_check = checks[first.name].get(RDZV_PORT)
    if others and port_check is not None and port_check.ok:
        replaced, reached = _rendezvous(first, others, transports, rdzv_port, timeout, clock)
        checks[first.name].update({RDZV_PORT: replaced} if replaced else {})
        for name, check in reached.items():
            checks[name][RDZV_REACHABLE] = check
    return _report(hosts, checks, facts, skipped)


def _report(
    hosts: Sequence[ResolvedHost],
    checks: dict[str, dict[str, Check]],
    facts: dict[str, dict[str, Any]],
    skipped: dict[str, str],
) -> DoctorReport:
    """Every host's checks in :data:`CHECKS` order (the first host has no reachability
    check, the others no port check); a check that never ran is a skipped failure
    saying why (the host's own problem, else the first host's missing listener)."""
    first = hosts[0]
    no_listener = f"{first.name} {skipped.get(first.name, 'has no rendezvous listener')}"
    reports = []
    for h in hosts:
        names = [c for c in CHECKS if c != (RDZV_REACHABLE if h is first else RDZV_PORT)]
        own = checks[h.name]
        for n in names:
            if n not in own:
                own[n] = Check(n, False, f"skipped: {skipped.get(h.name, no_listener)}", True)
        own_checks = tuple(own[n] for n in names)
        reports.append(HostReport(h.name, h.address, own_checks, facts.get(h.name, {})))
    return DoctorReport(tuple(reports))
