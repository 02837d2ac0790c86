"""``strategy: {name: auto, advice: FILE}``: a job that takes its strategy from an
advice file ``dmlctl bench advise --save FILE`` wrote. The loader swaps the advised
``strategy`` and ``parameter_servers`` in before the job is validated, so the result
is checked like any job file, and keeps a one-line note of where it came from.

An advice file is YAML: ``strategy`` (a job file's strategy mapping),
``parameter_servers`` (an int), and ``target``, ``scenario`` and ``why`` (text saying
what the advisor measured).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

AUTO = "auto"
REQUIRED = {"strategy": Mapping, "parameter_servers": int, "why": str, "scenario": str}


class AdviceProblem(ValueError):
    """Why the advice could not be applied; the key path is the job file's."""

    def __init__(self, path: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.path = path


def wants_advice(data: Mapping[str, Any]) -> bool:
    """Whether the job file's strategy is ``auto``."""
    strategy = data.get("strategy")
    name = strategy.get("name") if isinstance(strategy, Mapping) else strategy
    return name == AUTO


def apply_advice(data: Mapping[str, Any], job_dir: Path) -> tuple[dict[str, Any], str]:
    """``data`` with the advised strategy and servers, and the note saying so;
    AdviceProblem naming the key and what is wrong."""
    strategy = data.get("strategy")
    if not isinstance(strategy, Mapping) or set(strategy) != {"name", "advice"}:
        raise AdviceProblem(
            ("strategy",),
            "strategy auto takes exactly an advice file: "
            "strategy: {name: auto, advice: advice.yaml} (from `dmlctl bench advise --save`)",
        )
    ref = strategy["advice"]
    if not isinstance(ref, str) or not ref.strip():
        raise AdviceProblem(("strategy", "advice"), "expected the path of an advice file")
    advice = _read(job_dir / ref, ref)
    out = dict(data)
    out["strategy"] = dict(advice["strategy"])
    out["parameter_servers"] = advice["parameter_servers"]
    params = advice["strategy"].get("params") or {}
    shown = " ".join(f"{k}={v}" for k, v in params.items())
    label = f"{advice['strategy'].get('name')} {shown}".strip()
    note = f"strategy {label} from {ref}: {advice['why']} ({advice['scenario']})"
    return out, note


def _read(path: Path, ref: str) -> Mapping[str, Any]:
    where = ("strategy", "advice")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AdviceProblem(where, f"advice file {ref}: {exc.strerror or exc}") from None
    try:
        advice = yaml.safe_load(text)
    except yaml.YAMLError:
        raise AdviceProblem(where, f"advice file {ref} is not YAML") from None
    if not isinstance(advice, Mapping):
        raise AdviceProblem(where, f"advice file {ref} is not a mapping")
    for key, kind in REQUIRED.items():
        value = advice.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise AdviceProblem(
                where, f"advice file {ref}: {key!r} missing or not a {kind.__name__}"
            )
    if advice["strategy"].get("name") == AUTO:
        raise AdviceProblem(where, f"advice file {ref} advises strategy auto")
    return advice
