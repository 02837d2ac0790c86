"""The ``parallelism:`` block of a job file and its ``parallelize: FILE:FUNCTION`` (pure).

``ParallelismSpec`` uses torchtitan's key names and is the one definition of their
defaults and bounds. It is validated once when the job file is read; the planner
resolves it for the job's number of workers with :meth:`ParallelismSpec.layout` (a
:class:`dmlctl.mesh.MeshLayout`, which the plan carries and hands to the ranks).
Which strategies a device mesh combines with is decided here too
(:meth:`ParallelismSpec.check_strategy`).
"""

from __future__ import annotations

import ast
import difflib
import keyword
import math
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from dmlctl.mesh import SCHEDULES, MeshLayout, schedule_name
from dmlctl.spec.fields import FROZEN, MAX_WORKERS, shown
from dmlctl.strategies import registry
from dmlctl.strategies.params import changed

__all__ = [
    "DEGREES",
    "MAX_MICROBATCHES",
    "MeshMismatch",
    "ParallelismSpec",
    "missing_function",
    "split_parallelize",
]

MAX_MICROBATCHES = 65536
"""Most pipeline microbatches of one step."""

DEGREES = {
    "tensor_parallel_degree": "tp",
    "pipeline_parallel_degree": "pp",
    "data_parallel_shard_degree": "dp_shard",
    "data_parallel_replicate_degree": "dp_replicate",
}
"""The degree keys, in the order a job file lists them, and their mesh dimensions."""

REPLICATE = "data_parallel_replicate_degree"

_EXAMPLE = "e.g. 'model.py:parallelize'"


class MeshMismatch(ValueError):
    """The degrees do not fit the number of workers; ``key`` is the degree most at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _invalid(key: str, message: str, value: object) -> ValidationError:
    """A validation error at ``key`` (below the model that raises it)."""
    error = InitErrorDetails(
        type=PydanticCustomError("parallelism", message), loc=(key,), input=value
    )
    return ValidationError.from_exception_data("parallelism", [error])


def _schedule_hint(name: str) -> str:
    """`` (did you mean '1F1B'?)`` for a name close to a schedule, else ``""``."""
    lower = {s.lower(): s for s in SCHEDULES}
    close = difflib.get_close_matches(name.lower()[:100], list(lower), n=1)
    return f" (did you mean {lower[close[0]]!r}?)" if close else ""


Degree = Annotated[int, Field(ge=1, le=MAX_WORKERS)]
"""A dimension's number of workers."""


class ParallelismSpec(BaseModel):
    """A job's device mesh: ``pp × dp_replicate × dp_shard × tp`` (tp innermost).

    Every degree is at least 1 and at most :data:`MAX_WORKERS`;
    ``data_parallel_replicate_degree`` may be -1 (the default): the workers the other
    degrees leave. The pipeline settings only apply with ``pipeline_parallel_degree``
    above 1 (setting them otherwise is an error). The schedule is stored as
    :data:`dmlctl.mesh.SCHEDULES` spells it.
    """

    model_config = FROZEN

    tensor_parallel_degree: Degree = 1
    """Workers each layer's tensors are split over (tensor parallelism, the innermost dimension:
    neighbouring ranks)."""
    pipeline_parallel_degree: Degree = 1
    """Workers a replica's layers are split over as pipeline stages (the outermost dimension; looped
    and V-shaped schedules give each rank two stages)."""
    pipeline_parallel_schedule: str = Field(
        default="1F1B",
        description="Pipeline schedule, as torch.distributed.pipelining names it "
        f"(case-insensitive): {', '.join(SCHEDULES)}.",
    )
    pipeline_parallel_microbatches: int | None = Field(default=None, ge=1, le=MAX_MICROBATCHES)
    """Microbatches each batch is split into for the pipeline; default: derived by the runtime."""
    data_parallel_shard_degree: Degree = 1
    """Workers each replica's parameters are sharded over (FSDP2 fully_shard)."""
    data_parallel_replicate_degree: Annotated[int, Field(ge=-1, le=MAX_WORKERS)] = -1
    """Model replicas (data parallelism); -1 (the default): the workers the other degrees leave."""

    @field_validator(REPLICATE)
    @classmethod
    def _not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError("must be -1 (the workers the other degrees leave) or >= 1, got 0")
        return value

    @field_validator("pipeline_parallel_schedule")
    @classmethod
    def _known_schedule(cls, value: str) -> str:
        name = schedule_name(value)
        if name is None:
            raise ValueError(
                f"unknown schedule {shown(value)}{_schedule_hint(value)}; "
                f"valid: {', '.join(SCHEDULES)}"
            )
        return name

    @model_validator(mode="after")
    def _pipeline_settings_need_a_pipeline(self) -> ParallelismSpec:
        # changed(), not model_fields_set: a dumped and re-validated spec sets every field.
        if self.pipeline_parallel_degree > 1:
            return self
        for key in ("pipeline_parallel_schedule", "pipeline_parallel_microbatches"):
            if key in changed(self):
                raise _invalid(
                    key,
                    "only applies with pipeline_parallel_degree > 1 "
                    "(pipeline_parallel_degree is 1)",
                    getattr(self, key),
                )
        return self

    def layout(self, workers: int) -> MeshLayout:
        """The mesh of ``workers`` workers: ``-1`` resolved to the workers left.

        Raises :class:`MeshMismatch` (a ValueError naming the degrees, their product
        and the worker count) when the degrees do not multiply to ``workers``, or, with
        ``data_parallel_replicate_degree: -1``, do not divide it.
        """
        degrees = {key: int(getattr(self, key)) for key in DEGREES}
        fixed = {k: v for k, v in degrees.items() if v != -1}
        product = math.prod(fixed.values())
        if degrees[REPLICATE] == -1 and workers % product == 0:
            degrees[REPLICATE] = workers // product
        elif degrees[REPLICATE] == -1 or product != workers:
            raise self._mismatch(fixed, workers)
        sizes = {DEGREES[k]: v for k, v in degrees.items()}
        return MeshLayout(
            **sizes,
            schedule=self.pipeline_parallel_schedule,
            microbatches=self.pipeline_parallel_microbatches or 0,
        )

    def _mismatch(self, fixed: dict[str, int], workers: int) -> MeshMismatch:
        """Why ``fixed`` (the degrees other than -1) does not fit ``workers``, at the
        key most at fault: the first degree that does not divide ``workers``, else an
        explicit replicate degree, else the last degree above 1."""
        product = math.prod(fixed.values())
        shown = [f"{k} {v}" for k, v in fixed.items() if v > 1 or k == REPLICATE]
        terms = " × ".join(shown) if len(shown) < 2 else f"{' × '.join(shown)} = {product}"
        if REPLICATE in fixed:
            message = f"{terms}, but the degrees must multiply to the number of workers ({workers})"
        else:
            message = (
                f"{terms} does not divide the number of workers ({workers}); "
                f"make workers a multiple of {product}"
            )
        apart = [k for k, v in fixed.items() if workers % v]
        if apart:
            return MeshMismatch(apart[0], message)
        if REPLICATE in fixed:
            return MeshMismatch(REPLICATE, message)
        return MeshMismatch([k for k, v in fixed.items() if v > 1][-1], message)

    def check_strategy(self, strategy: str, params: BaseModel) -> None:
        """Refuse a strategy the mesh does not combine with: ``ssgd`` needs
        ``compression: none``; ``asgd`` (DistBelief) needs model parallelism inside
        each replica (tensor or pipeline degree > 1) and no FSDP (shard degree 1).
        Raises ValueError (about the block) or a ValidationError at the key at fault."""
        if not registry.capabilities(strategy).parallelism:
            raise ValueError(
                "combines only with strategy ssgd (synchronous replicas, FSDP2 shards) or "
                "asgd (DistBelief: model-parallel replicas, asynchronous through parameter "
                f"servers); strategy is {strategy!r}"
            )
        compression = getattr(params, "compression", "none")
        if strategy == "ssgd" and compression != "none":
            raise ValueError(
                "combines with strategy ssgd only with compression: none (gradient "
                f"compression is a DDP hook, unused on a device mesh); compression is "
                f"{compression!r}"
            )
        if strategy == "asgd" and self.data_parallel_shard_degree != 1:
            raise _invalid(
                "data_parallel_shard_degree",
                "must be 1 with strategy asgd (each replica exchanges its parameters "
                "whole with the parameter servers)",
                self.data_parallel_shard_degree,
            )
        if strategy == "asgd" and self.tensor_parallel_degree == self.pipeline_parallel_degree == 1:
            raise ValueError(
                "with strategy asgd needs tensor_parallel_degree or pipeline_parallel_degree "
                "> 1 (model parallelism inside each replica); for data parallelism alone, "
                "remove parallelism"
            )


def split_parallelize(value: str) -> tuple[str, str]:
    """``FILE:FUNCTION`` as ``(FILE, FUNCTION)``: FILE a relative path ending in
    ``.py``, FUNCTION a Python identifier; ValueError saying what is wrong otherwise."""
    file, colon, function = value.rpartition(":")
    if not colon or not file:
        raise ValueError(f"must be FILE:FUNCTION ({_EXAMPLE}), got {shown(value)}")
    if not function.isidentifier() or keyword.iskeyword(function):
        raise ValueError(
            f"{shown(function)} is not a Python function name; expected FILE:FUNCTION ({_EXAMPLE})"
        )
    if not file.endswith(".py") or file.rsplit("/", 1)[-1] == ".py":
        raise ValueError(f"{shown(file)} is not a .py file; expected FILE:FUNCTION ({_EXAMPLE})")
    if file.startswith(("/", "~")):
        raise ValueError(f"{shown(file)} must be a path relative to workdir ({_EXAMPLE})")
    return file, function


def missing_function(path: Path, function: str) -> str | None:
    """Why ``path`` (a Python file) does not define ``function`` at module level — a
    ``def``, or a name an assignment or import binds, also under a top-level ``if``,
    ``try`` or ``with`` — with a did-you-mean; None when it does, or when the file
    cannot be parsed (running it reports that). Reads the source only: nothing is
    imported or run."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    names = [name for node in tree.body for name in _bound(node)]
    if function in names or "*" in names:
        return None
    close = difflib.get_close_matches(function, names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{path.name} defines no function {function!r}{hint}"


def _bound(node: ast.stmt) -> list[str]:
    """The module-level names statement ``node`` may bind (not those inside the bodies
    of the functions and classes it defines)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    inner = [getattr(node, field, []) for field in ("body", "orelse", "finalbody")]
    inner += [h.body for h in getattr(node, "handlers", [])]
    return [name for block in inner for stmt in block for name in _bound(stmt)]
