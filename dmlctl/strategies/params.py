"""What every strategy's parameter model shares (torch-free): its config, its bounds
and the role sets.

Parameters are validated strictly (a ``true`` is not a number, ``1.0`` is not a step
count), non-finite floats are refused, and every number has an upper bound, so a
job file cannot ask for a period of ``1e29`` steps.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.config import JsonDict
from pydantic.fields import FieldInfo

from dmlctl.protocol import ROLE_SERVER, ROLE_WORKER

PARAMS_CONFIG = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
"""Model config of every strategy's ``Params``; what a parameter means is its attribute
docstring (:func:`dmlctl.spec.field_docs.field_docs`)."""

MAX_PERIOD = 1_000_000
"""Most steps of a period (steps between exchanges, pushes, fetches; staleness)."""

MAX_STEPS = 1_000_000_000
"""Most steps of a warm-up."""

MAX_LOW_RANK = 1024
"""Largest rank of a low-rank approximation (PowerSGD's r)."""

MAX_WEIGHT = 1e6
"""Largest weight, penalty or rate (ρ, c, scales, compression rates)."""

Steps = Annotated[int, Field(ge=1, le=MAX_PERIOD)]
"""A parameter counting steps (a period, steps per round, a delay): at least 1, at most
:data:`MAX_PERIOD`."""

Count = Annotated[int, Field(ge=0, le=MAX_PERIOD)]
"""A parameter counting steps or workers where 0 means none (staleness, backup
workers, a measurement's interval): at most :data:`MAX_PERIOD`."""

Share = Annotated[float, Field(gt=0, le=1)]
"""A parameter that is a share of a whole (a density, β): above 0, at most 1."""

Weight = Annotated[float, Field(gt=0, le=MAX_WEIGHT)]
"""A positive weight, penalty or rate: above 0, at most :data:`MAX_WEIGHT`."""

FetchEvery = Annotated[
    int,
    Field(
        ge=1,
        le=MAX_PERIOD,
        description="Pull fresh parameters from the servers every n_fetch steps.",
    ),
]
"""``n_fetch`` of the parameter-server strategies that pull on a period of their own
(asgd, adadelay)."""

WORKERS_ONLY: tuple[str, ...] = (ROLE_WORKER,)
"""``ROLES`` of a strategy whose every rank trains."""

WITH_SERVERS: tuple[str, ...] = (ROLE_WORKER, ROLE_SERVER)
"""``ROLES`` of a parameter-server strategy: workers and server ranks."""


@dataclass(frozen=True)
class Capabilities:
    """What a strategy is and can do, declared once in its params module as
    ``CAPABILITIES`` and read from the registry by the spec, the planner, the runtime
    and the dashboard:

    * ``roles`` — the roles of its ranks (:data:`WORKERS_ONLY` or :data:`WITH_SERVERS`);
    * ``columns`` — metric keys its ranks report that the dashboard shows as columns
      of their own (``dmlctl.ui.metric_columns`` says what each means);
    * ``needs_runtime`` — whether a script must call ``ctx.prepare`` for it to act
      (False: ``none``, and ``ssgd``'s DDP a plain torchrun script builds itself);
      ``runtime_rule`` decides it by the parameters where they are known (ssgd with
      compression needs the runtime);
    * ``host_memory`` — its workers train on the CPU even on a GPU host (they share
      parameters through the host's memory);
    * ``parallelism`` — it combines with a ``parallelism:`` block (tensor, pipeline,
      sharded replicas); ``fsdp`` — its data-parallel dimensions are FSDP2 shards;
    * ``check_world`` / ``check_hosts`` — why the job cannot run on that many workers
      or hosts with these parameters, or None;
    * ``in_place`` — a worker killed by a signal can be started again alone while the
      others go on (``restart.mode: in_place``; a parameter server too, from its
      snapshot).
    """

    roles: tuple[str, ...] = (ROLE_WORKER,)
    columns: tuple[str, ...] = ()
    needs_runtime: bool = True
    runtime_rule: Callable[[Any], bool] | None = None
    host_memory: bool = False
    parallelism: bool = False
    fsdp: bool = False
    check_world: Callable[[Any, int], str | None] | None = None
    check_hosts: Callable[[Any, int], str | None] | None = None
    in_place: bool = False
    #: With ``in_place``: why these params cannot be replaced in place (None: they can).
    in_place_rule: Callable[[Any], str | None] | None = None

    def runtime_needed(self, params: BaseModel | None) -> bool:
        """Whether a script must call ``ctx.prepare`` with ``params`` (None: not known)."""
        if self.runtime_rule is not None and params is not None:
            return bool(self.runtime_rule(params))
        return self.needs_runtime


def threshold_in_place(params: Any) -> str | None:
    """Why ``restart.mode: in_place`` cannot take a model filter's ``threshold`` (the
    filter's flags are a collective of their own); None without one."""
    if getattr(params, "threshold", 0) > 0:
        return "with a threshold (its filter's flags are one more collective)"
    return None


SERVER_COLUMNS: tuple[str, ...] = (
    "clock",
    "staleness_max",
    "push_per_s",
    "push_bytes_per_s",
    "clock_spread",
)
"""The dashboard columns of a parameter-server strategy's ranks (metric keys, see
``dmlctl.ui.metric_columns``): the workers' clock, the servers' staleness, traffic and
clock spread."""


def server_capabilities(
    *columns: str,
    check_world: Callable[[Any, int], str | None] | None = None,
    parallelism: bool = False,
) -> Capabilities:
    """The :class:`Capabilities` of a parameter-server strategy: workers and servers
    (:data:`WITH_SERVERS`), the dashboard's :data:`SERVER_COLUMNS` then its own
    ``columns``, a worker (or a server) replaced in place; ``check_world`` and
    ``parallelism`` as :class:`Capabilities` has them."""
    return Capabilities(
        roles=WITH_SERVERS,
        columns=(*SERVER_COLUMNS, *columns),
        parallelism=parallelism,
        check_world=check_world,
        in_place=True,
    )


def derived(rule: str) -> JsonDict:
    """``json_schema_extra`` of a parameter whose default (None) is derived at start:
    ``rule`` says how (``dmlctl strategies NAME`` shows it as the default)."""
    return {"derived": rule}


def derived_weight(rule: str, description: str, *, most: float = MAX_WEIGHT) -> Any:
    """The ``Field`` of an optional positive weight (ρ, α, a scale): None, the
    default, is derived at start by ``rule`` (:func:`derived`); a value given must be
    above 0 and at most ``most``."""
    return Field(
        default=None, json_schema_extra=derived(rule), gt=0, le=most, description=description
    )


def derived_steps(rule: str, description: str) -> Any:
    """The ``Field`` of an optional count of steps or workers: None, the default, is
    derived at start by ``rule`` (:func:`derived`); a value given must be at least 1
    and at most :data:`MAX_PERIOD`."""
    return Field(
        default=None, json_schema_extra=derived(rule), ge=1, le=MAX_PERIOD, description=description
    )


def at_least(
    name: str, minimum: int, why: str = "", *, above: bool = False
) -> Callable[[Any], Any]:
    """A field validator (``field_validator(name)(at_least(...))``) that refuses a
    value below ``minimum`` (``above``: at or below it) with "``name`` must be ≥
    ``minimum`` (``why``), got ``value``" and passes any other value through."""
    sign = ">" if above else "≥"
    reason = f" ({why})" if why else ""

    def check(value: Any) -> Any:
        if value <= minimum if above else value < minimum:
            raise ValueError(f"{name} must be {sign} {minimum}{reason}, got {value}")
        return value

    return check


def one_host(strategy: str) -> Callable[[BaseModel, int], str | None]:
    """The host check (:attr:`Capabilities.check_hosts`) of a ``strategy`` whose
    workers share parameters through the memory of one host: why the job cannot run
    on that many hosts (more than one), or None."""

    def check_hosts(params: BaseModel, n_hosts: int) -> str | None:
        del params
        if n_hosts > 1:
            return (
                f"{strategy} shares parameters through the memory of one host, but the job "
                f"would run on {n_hosts} hosts: set max_hosts: 1 or fewer workers "
                "(at most one host's slots)"
            )
        return None

    return check_hosts


class FinalModel(BaseModel):
    """The ``final`` parameter of the strategies whose replicas drift apart during
    training (local-sgd, dpsgd, bmuf, easgd, admm, easgd-async)."""

    model_config = PARAMS_CONFIG

    final: Literal["consensus", "local"] = "consensus"
    """At the end of training every worker takes the model the algorithm defines (the average, the
    block-updated global model, the center, z), so every rank saves the same result; 'local'
    keeps each worker's own replica."""


def changed(model: BaseModel) -> set[str]:
    """The fields of ``model`` whose value is not their default: what a job file set
    to something else. Unlike ``model_fields_set`` it survives a round trip through
    ``model_dump``/``model_validate`` (which sets every field)."""
    return {
        name
        for name, info in type(model).model_fields.items()
        if not info.is_required() and getattr(model, name) != info.default
    }


class ModelFilter(BaseModel):
    """The ``threshold`` model filter of the model-averaging strategies (local-sgd,
    bmuf, easgd; :class:`dmlctl.strategies.common.ChangeFilter`)."""

    model_config = PARAMS_CONFIG

    threshold: float = Field(default=0.0, ge=0, le=MAX_WEIGHT)
    """Model filter: a round sends only the tensors whose change since they were last sent (easgd:
    distance from the center) exceeds threshold × their norm on some worker; the others keep
    their change for a later round (0: every tensor, every round)."""


class Averaging(FinalModel, ModelFilter):
    """What the model-averaging strategies' parameters share (local-sgd, bmuf, easgd):
    the ``threshold`` model filter and the ``final`` model."""

    model_config = PARAMS_CONFIG


class Overlap(BaseModel):
    """``overlap`` of the asynchronous parameter-server strategies (asgd, easgd-async,
    aadmm; :mod:`dmlctl.ps.overlap`)."""

    model_config = PARAMS_CONFIG

    overlap: bool = False
    """Overlap communication with computation (double buffering): each push and pull runs in a
    background thread while the next step computes, and the model it pulled is taken at the next
    exchange (one exchange staler)."""


class PushCompression(BaseModel):
    """The push filter of the parameter-server strategies: what a worker's pushes
    are encoded with (:mod:`dmlctl.runtime.filters`), with error feedback on the
    worker."""

    model_config = PARAMS_CONFIG

    push_compression: Literal["none", "int8", "topk", "sign", "threshold"] = "none"
    """Encode every push: int8 (a quarter of the bytes plus a scale per shard), topk (the largest
    entries: density × (values + indices)), sign (1 bit per entry plus a scale per tensor) or
    threshold (only the tensors whose change exceeds push_threshold × their norm, plus a
    1-bit-per-tensor mask); what an encoding drops is carried into the worker's next push (error
    feedback)."""
    push_density: Share = 0.01
    """push_compression topk: share of each shard's entries pushed."""
    push_threshold: Weight = 0.01
    """push_compression threshold: a tensor is pushed once its change since it was last pushed
    exceeds this share of its norm."""

    @model_validator(mode="after")
    def _settings_need_their_filter(self) -> PushCompression:
        for name, kind in (("push_density", "topk"), ("push_threshold", "threshold")):
            if name in changed(self) and self.push_compression != kind:
                raise ValueError(
                    f"{name} only applies with push_compression: {kind} "
                    f"(push_compression is {self.push_compression!r})"
                )
        return self

    def push_spec(self) -> dict[str, Any] | None:
        """What the layout carries to the servers (None: pushes as they are)."""
        if self.push_compression == "none":
            return None
        spec: dict[str, Any] = {"kind": self.push_compression}
        if self.push_compression == "topk":
            spec["density"] = self.push_density
        if self.push_compression == "threshold":
            spec["threshold"] = self.push_threshold
        return spec


def type_name(annotation: Any) -> str:
    """A parameter's type as a user reads it: ``int``, ``float``, ``bool``, or the
    choices of a ``Literal`` (``consensus | local``); ``None`` of an optional left out."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(str(v) for v in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(annotation) if a is not type(None))
    return str(getattr(annotation, "__name__", annotation))


def default_text(field: FieldInfo) -> str:
    """The default as ``dmlctl strategies NAME`` shows it: the value, or the rule of
    a default derived at start (:func:`derived`)."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "derived" in extra:
        return str(extra["derived"])
    if field.is_required():
        return "-"
    return str(field.default).lower() if isinstance(field.default, bool) else str(field.default)


def range_text(field: FieldInfo) -> str:
    """The bounds the field declares (``> 0, ≤ 1e+06``), or ``""``."""
    marks = (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))  # annotated-types' names
    parts = []
    for item in field.metadata:
        for attr, sign in marks:
            bound = getattr(item, attr, None)
            if isinstance(bound, int | float) and not isinstance(bound, bool):
                shown = f"{int(bound):,}" if float(bound).is_integer() else f"{bound:g}"
                parts.append(f"{sign} {shown}")
    return ", ".join(parts)
