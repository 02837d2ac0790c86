"""The runs ``dmlctl bench strategies`` compares, as data: which strategy, with which
parameters and how many parameter servers, measured against which baseline, and the
job file each becomes (torch-free).

Every run trains ``strategy_jobs/train.py`` on 2 local workers; the jobs differ only
in their ``strategy`` block and ``parameter_servers``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOBS_DIR = Path(__file__).resolve().parent / "strategy_jobs"
WORKERS = 2
WARMUP_STEPS = 48  # untimed steps; a multiple of local-sgd's period 8


@dataclass(frozen=True)
class Row:
    """One measured run: ``strategy`` with ``params`` (and ``servers`` parameter
    servers) on ``model``; its bytes per step are reported relative to the row named
    ``against`` in the same table (None: none), which ``goal`` bounds."""

    strategy: str
    params: dict[str, Any] = field(default_factory=dict)
    servers: int = 0
    goal: float | None = None
    against: str | None = "ssgd"
    model: str = "matrices"


BYTES: dict[str, Row] = {
    "ssgd": Row("ssgd", against=None),
    "local-sgd period 8": Row("local-sgd", {"period": 8}, goal=1 / 8),
    "ssgd powersgd rank 1": Row("ssgd", {"compression": "powersgd"}, goal=1 / 10),
    # a quarter of float32, plus a float32 scale per bucket
    "ssgd int8": Row("ssgd", {"compression": "int8"}, goal=0.26),
    # 1 % of the entries, each a float32 value and an int32 index: 2 %
    "ssgd topk 1%": Row("ssgd", {"compression": "topk"}, goal=0.021),
    # one bit per entry, plus a float32 scale per tensor
    "ssgd sign": Row("ssgd", {"compression": "sign"}, goal=1 / 30),
}
"""ssgd's compressions and model averaging, against uncompressed ssgd."""

FILTERS: dict[str, Row] = {
    # the model filter: a round sends only the tensors that changed by > 1 % of their norm
    "local-sgd period 8": Row("local-sgd", {"period": 8}, against=None),
    "local-sgd period 8, threshold 0.01": Row(
        "local-sgd", {"period": 8, "threshold": 0.01}, against="local-sgd period 8"
    ),
    "bmuf": Row("bmuf", against=None),
    "bmuf, threshold 0.01": Row("bmuf", {"threshold": 0.01}, against="bmuf"),
    "easgd": Row("easgd", against=None),
    "easgd, threshold 0.01": Row("easgd", {"threshold": 0.01}, against="easgd"),
    # parameter-server pushes (a push and a pull per step), against asgd's plain pushes
    "asgd": Row("asgd", servers=1, against=None),
    "asgd push int8": Row("asgd", {"push_compression": "int8"}, 1, against="asgd"),
    "asgd push topk 1%": Row("asgd", {"push_compression": "topk"}, 1, against="asgd"),
    "asgd push sign": Row("asgd", {"push_compression": "sign"}, 1, against="asgd"),
    "asgd push threshold 0.01": Row("asgd", {"push_compression": "threshold"}, 1, against="asgd"),
}
"""The model filter and the parameter-server push filters: each model-filter row
against the same strategy without it, each push filter against plain ``asgd``."""

OVERLAP: dict[str, Row] = {
    "asgd": Row("asgd", servers=1),
    "easgd-async": Row("easgd-async", servers=1),
    "aadmm": Row("aadmm", servers=1),
}
"""The asynchronous strategies measured with ``overlap: false`` and ``true``."""


def job_spec(name: str, row: Row, steps: int) -> dict[str, Any]:
    """The job file (as a mapping) of ``row`` with ``steps`` training steps."""
    spec: dict[str, Any] = {
        "name": "bench-" + re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-"),
        "script": "train.py",
        "args": script_args(row.model, steps),
        "workdir": str(JOBS_DIR),
        "workers": WORKERS,
        "strategy": {"name": row.strategy, "params": dict(row.params)},
    }
    if row.servers:
        spec["parameter_servers"] = row.servers
    return spec


def script_args(model: str, steps: int) -> list[str]:
    """Arguments of both training scripts."""
    return ["--model", model, "--steps", str(steps), "--warmup", str(WARMUP_STEPS)]
