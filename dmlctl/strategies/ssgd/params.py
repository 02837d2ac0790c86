"""The parameters of an ``ssgd`` job, and when a job needs ``ctx.prepare`` (torch-free:
the control plane imports it). The strategy is :mod:`dmlctl.strategies.ssgd.strategy`."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator, model_validator

from dmlctl.strategies.params import (
    MAX_LOW_RANK,
    MAX_STEPS,
    MAX_WEIGHT,
    PARAMS_CONFIG,
    WORKERS_ONLY,
    Capabilities,
    changed,
)

QUALITY = (
    "matches one process: the language model (3 epochs, 2 workers) ends within 0.01 % "
    "of its validation loss with AdamW and with SGD + Nesterov (bound 0.5 %), digits "
    "within 0.3 points; the compressions within 0.8 points on digits (sign with Adam "
    "1.7 on one seed, 0.6 over three)."
)
COMPRESSIONS: tuple[str, ...] = ("none", "fp16", "bf16", "powersgd", "int8", "topk", "sign")
_ONLY_WITH: dict[str, tuple[str, ...]] = {
    "powersgd_rank": ("powersgd",),
    "powersgd_warmup_steps": ("powersgd",),
    "powersgd_error_feedback": ("powersgd",),
    "powersgd_min_compression_rate": ("powersgd",),
    "topk_density": ("topk",),
    "int8_stochastic": ("int8",),
    "error_feedback": ("topk", "sign"),
}
"""The compression parameters, and the compressions each applies to."""


class Params(BaseModel):
    """``strategy.params`` of an ``ssgd`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    bucket_cap_mb: float = Field(default=25.0, gt=0, le=65536)
    """Gradient bucket size in MiB: smaller buckets start all-reduces earlier during backward,
    larger ones send fewer messages."""
    find_unused_parameters: bool = False
    """Set when some parameters get no gradient in a step (conditional branches); costs a graph
    traversal every step."""
    gradient_as_bucket_view: bool = True
    """Let .grad tensors alias the communication buckets: saves one copy and the memory of one
    gradient set."""
    broadcast_buffers: bool = True
    """Copy rank 0's buffers (e.g. BatchNorm running stats) to every worker at the start of each
    forward. Buffers are synced once at wrap time either way."""
    compression: str = "none"
    """Gradient compression: none (float32 buckets), fp16 / bf16 (buckets cast to 16 bits: half the
    bytes), powersgd (rank-r factors of each matrix), int8 (a quarter of the bytes plus a scale
    per bucket), topk (the largest entries: density × (values + indices)) or sign (1 bit per
    entry plus a scale)."""
    powersgd_rank: int = Field(default=1, ge=1, le=MAX_LOW_RANK)
    """PowerSGD matrix approximation rank r."""
    powersgd_warmup_steps: int = Field(le=MAX_STEPS, default=10)
    """Steps of plain all-reduce before PowerSGD starts (start_powerSGD_iter); at least 2."""
    powersgd_error_feedback: bool = True
    """Add each step's compression error to the next step's gradient."""
    powersgd_min_compression_rate: float = Field(default=2.0, gt=0, le=MAX_WEIGHT)
    """Compress an n×m matrix only when n·m > (n + m)·r·rate; others are all-reduced as is."""

    topk_density: float = Field(default=0.01, gt=0, le=1)
    """topk: share of each bucket's entries sent (the largest in magnitude), k = ceil(density · n);
    each costs a float32 value and an int32 index."""
    int8_stochastic: bool = False
    """int8: round stochastically (unbiased) instead of to the nearest value."""
    error_feedback: bool = True
    """topk and sign: carry what the encoding dropped into the next step's gradient, so nothing is
    lost, only delayed."""

    @field_validator("compression")
    @classmethod
    def _known_compression(cls, value: str) -> str:
        if value not in COMPRESSIONS:
            raise ValueError(f"unknown compression {value!r}; valid: {', '.join(COMPRESSIONS)}")
        return value

    @field_validator("powersgd_warmup_steps")
    @classmethod
    def _warmup_at_least_two(cls, value: int) -> int:
        if value < 2:
            raise ValueError(
                f"powersgd_warmup_steps must be >= 2, got {value}: torch's PowerSGD needs "
                "2 plain all-reduce steps (DDP rebuilds its buckets after the first step)"
            )
        return value

    @model_validator(mode="after")
    def _compression_params_need_their_compression(self) -> Params:
        for key, kinds in _ONLY_WITH.items():
            if key in changed(self) and self.compression not in kinds:
                raise ValueError(
                    f"{key} only applies with compression: {' or '.join(kinds)} "
                    f"(compression is {self.compression!r})"
                )
        return self


def needs_runtime(params: BaseModel) -> bool:
    """A plain DDP script is ssgd with its defaults; any parameter the job sets
    (compression, bucket size, …) only applies through ``ctx.prepare``."""
    return bool(params.model_fields_set)


def in_place_rule(params: Params) -> str | None:
    """Why ``restart.mode: in_place`` cannot take these params (None: it can): the
    compressions that keep state in DDP's buckets (in place averages without DDP)."""
    if params.compression in ("none", "fp16", "bf16"):
        return None
    return (
        f"with compression {params.compression!r} (it works on DDP's gradient buckets, "
        "which in place does not use; none, fp16 and bf16 apply)"
    )


CAPABILITIES = Capabilities(
    roles=WORKERS_ONLY, needs_runtime=False, runtime_rule=needs_runtime, parallelism=True,
    fsdp=True, in_place=True, in_place_rule=in_place_rule,
)  # fmt: skip
