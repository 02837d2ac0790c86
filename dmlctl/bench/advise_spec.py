"""What ``dmlctl bench advise`` is asked: the candidates, the target and the budget,
parsed and validated once (torch-free).

* A candidate is ``name`` or ``name:key=value;key=value``; a value may list
  alternatives with ``|`` (a grid): ``local-sgd:period=4|16`` is two candidates.
  Values are read as YAML scalars (``4`` an int, ``true`` a bool, ``powersgd`` a
  string) and checked by the strategy's own parameter model.
* A target is ``METRIC>=VALUE`` or ``METRIC<=VALUE`` (also ``>`` and ``<``).
* A budget is seconds (``90``) or a duration (``90s``, ``10m``, ``1h``).
* Scenarios: the cluster as given, then one per ``--lab BANDWIDTH`` (the same
  candidates on a ``dmlctl lab`` network of that bandwidth) and one for
  ``--straggler 3x`` (the cluster as given, its last worker 3× slower).
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dmlctl.errors import UsageError
from dmlctl.lab.rates import parse_bandwidth, show_rate
from dmlctl.protocol import ROLE_SERVER
from dmlctl.spec.models import StrategySpec
from dmlctl.strategies import registry

DEFAULT_CANDIDATES = "ssgd,ssgd:compression=powersgd,local-sgd,bmuf,dpsgd"
"""Synchronous SGD against the communication-efficient strategies that need no
parameter server (so any job and cluster can run them)."""

_TARGET = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_./-]*)\s*(>=|<=|>|<)\s*([-+0-9.eE]+)\s*$")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|m|h)?\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}


@dataclass(frozen=True)
class Target:
    """``metric op value``: the metric the script logs and when it counts as reached."""

    metric: str
    op: str
    value: float

    def reached(self, value: float) -> bool:
        """Whether a logged ``value`` meets the target."""
        return _OPS[self.op](value, self.value)

    @property
    def higher_is_better(self) -> bool:
        return self.op in (">=", ">")

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


@dataclass(frozen=True)
class Candidate:
    """One strategy with its parameters; ``servers`` parameter servers (1 for the
    strategies that have them, unless the job asks for more)."""

    strategy: str
    params: Mapping[str, Any] = field(default_factory=dict)
    servers: int = 0

    @property
    def label(self) -> str:
        """``local-sgd period=16``: the strategy and the parameters set."""
        shown = " ".join(f"{k}={_scalar(v)}" for k, v in self.params.items())
        return f"{self.strategy} {shown}".strip()

    def strategy_block(self) -> dict[str, Any]:
        """The job file's ``strategy`` mapping that applies this candidate."""
        return {"name": self.strategy, "params": dict(self.params)}


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("\n...").strip()


@dataclass(frozen=True)
class Scenario:
    """Where the candidates run: the given cluster (``cluster_file``, None for this
    machine), or a lab network of ``lab_bandwidth``; ``straggler`` > 1 slows the last
    worker that many times."""

    name: str
    cluster_file: Path | None = None
    lab_bandwidth: int | None = None
    """Bits per second of every lab host's link; None: not on a lab."""
    straggler: float = 1.0


def parse_scenarios(
    cluster_file: Path | None, labs: Sequence[str], straggler: str | None
) -> list[Scenario]:
    """The scenarios of one ``bench advise``: the cluster as given first."""
    base = "this machine" if cluster_file is None else f"cluster {cluster_file.name}"
    out = [Scenario(base, cluster_file)]
    rates = dict.fromkeys(parse_bandwidth(bw, "--lab") for bw in labs)
    out += [Scenario(f"lab {show_rate(bits)}", lab_bandwidth=bits) for bits in rates]
    if straggler is not None:
        factor = _factor(straggler)
        out.append(Scenario(f"{base}, straggler {factor:g}x", cluster_file, straggler=factor))
    return out


def _factor(text: str) -> float:
    try:
        factor = float(text.strip().removesuffix("x").removesuffix("×"))
    except ValueError:
        factor = 0.0
    if not 1.0 < factor <= 100.0:
        raise UsageError(f"--straggler {text!r}: expected a slowdown such as 3x (above 1)")
    return factor


def parse_target(text: str) -> Target:
    """``test_acc>=0.97`` as a :class:`Target`; UsageError naming ``--target``."""
    match = _TARGET.match(text)
    if match is None:
        raise UsageError(
            f"--target {text!r}: expected METRIC>=VALUE or METRIC<=VALUE, e.g. 'test_acc>=0.97'"
        )
    try:
        value = float(match.group(3))
    except ValueError:
        raise UsageError(f"--target {text!r}: {match.group(3)!r} is not a number") from None
    if not math.isfinite(value):
        raise UsageError(f"--target {text!r}: the value must be finite")
    return Target(match.group(1), match.group(2), value)


def parse_budget(text: str) -> float:
    """Seconds of ``90``, ``90s``, ``10m`` or ``1h``; UsageError naming ``--budget``."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise UsageError(f"--budget {text!r}: expected a positive duration such as 90s, 10m, 1h")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_candidates(text: str, job_servers: int) -> list[Candidate]:
    """The comma-separated candidates of ``text`` (grids expanded, duplicates
    dropped, order kept), each checked against its strategy's parameter model.
    Strategies with parameter servers get ``max(job_servers, 1)`` of them, the others
    none. UsageError naming ``--strategies`` and the candidate for anything wrong."""
    out: list[Candidate] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        for candidate in _expand(item, job_servers):
            if candidate not in out:
                out.append(candidate)
    if not out:
        raise UsageError("--strategies: no candidate given, e.g. 'ssgd,local-sgd:period=4|16'")
    return out


def _expand(item: str, job_servers: int) -> list[Candidate]:
    name, _, rest = item.partition(":")
    name = name.strip()
    try:
        roles = registry.capabilities(name).roles
    except registry.UnknownStrategy as exc:
        raise UsageError(f"--strategies {item!r}: {exc}") from None
    choices: list[tuple[str, list[Any]]] = []
    for pair in (p.strip() for p in rest.split(";") if p.strip()):
        key, eq, values = pair.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"--strategies {item!r}: {pair!r} is not KEY=VALUE")
        choices.append((key.strip(), [_value(v) for v in values.split("|")]))
    servers = max(job_servers, 1) if ROLE_SERVER in roles else 0
    grid = itertools.product(*(values for _, values in choices))
    candidates = [
        Candidate(name, {key: v for (key, _), v in zip(choices, combo, strict=True)}, servers)
        for combo in grid
    ]
    for candidate in candidates:
        _check(item, candidate)
    return candidates


def _value(text: str) -> Any:
    try:
        return yaml.safe_load(text.strip())
    except yaml.YAMLError:
        return text.strip()


def _check(item: str, candidate: Candidate) -> None:
    try:
        StrategySpec.model_validate(candidate.strategy_block())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p != "params")
        raise UsageError(
            f"--strategies {item!r}: {where + ': ' if where else ''}{first['msg']}"
        ) from None
