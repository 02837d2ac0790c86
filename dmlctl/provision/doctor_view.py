"""What ``dmlctl doctor`` (and a launch's preflight) shows of a
:class:`~dmlctl.provision.doctor.DoctorReport`: one table of checks per host, the
facts each host reported, and the same as JSON."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from dmlctl.provision.doctor import DoctorReport, gib


def _fact(value: Any, fmt: Callable[[Any], str] = str) -> Text:
    return Text("-" if value is None else fmt(value))


def _cuda(f: Mapping[str, Any]) -> Text:
    """A GPU host's CUDA, NCCL and driver versions in one cell ("-" without GPUs)."""
    if not f.get("gpus"):
        return Text("-")
    parts = [f"CUDA {f.get('cuda_version') or '?'}", f"NCCL {f.get('nccl') or '?'}"]
    return Text(", ".join([*parts, f"driver {f.get('driver') or '?'}"]))


def render_doctor(report: DoctorReport) -> RenderableType:
    """One row per host (what was found, then ``ready`` or each failed check in red with
    its detail) and a closing line ``all N hosts ready`` / ``K of N hosts failed``."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    gpus = any(h.facts.get("gpus") for h in report.hosts)  # a CUDA column where there are GPUs
    columns = ("host", "address", "python", "torch", "gpus", *(("cuda",) if gpus else ()))
    for col in (*columns, "disk free", "clock", "status"):
        table.add_column(col, no_wrap=col != "status", justify="right" if col == "gpus" else "left")
    for h in report.hosts:
        f = h.facts
        status = Text("ready", style="green") if h.ok else Text(style="red")
        for c in h.failures():
            status.append(("\n" if status.plain else "") + f"✗ {c.name}: {c.detail}")
        table.add_row(
            Text(h.host, style="bold"),
            Text(h.address),
            _fact(f.get("python")),
            _fact(f.get("torch")),
            _fact(f.get("gpus")),
            *((_cuda(f),) if gpus else ()),
            _fact(f.get("disk_free"), gib),
            _fact(f.get("clock_skew"), lambda s: f"{s:+.2f} s"),
            status,
        )
    failed, n = sum(not h.ok for h in report.hosts), len(report.hosts)
    closing = (
        Text("the host is ready" if n == 1 else f"all {n} hosts ready", style="bold green")
        if not failed
        else Text(
            "the host failed" if n == 1 else f"{failed} of {n} hosts failed", style="bold red"
        )
    )
    return Group(table, Text(), closing)


def doctor_json(report: DoctorReport) -> dict[str, Any]:
    """``{ok, total, failed, hosts: [{host, address, ok, checks: [{name, ok, skipped,
    detail}], facts}]}``: checks in :data:`CHECKS` order (``packages``' detail names
    every missing or out-of-range distribution); facts are the probe's answer
    (:data:`~dmlctl.provision.probe.PROBE_KEYS`, ``packages`` keyed by import name)
    plus clock_skew/clock_uncertainty."""
    return {
        "ok": report.ok,
        "total": len(report.hosts),
        "failed": sum(not h.ok for h in report.hosts),
        "hosts": [
            {
                "host": h.host,
                "address": h.address,
                "ok": h.ok,
                "facts": dict(h.facts),
                "checks": [
                    {"name": c.name, "ok": c.ok, "skipped": c.skipped, "detail": c.detail}
                    for c in h.checks
                ],
            }
            for h in report.hosts
        ],
    }
