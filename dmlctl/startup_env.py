"""Which environment variables a process reads as it starts: the interpreter, libgomp
and torch read them while they import, so a process forked from another one has the
values the other one started with, whatever its own environment says.

The zygote forks ranks only where these agree (:mod:`dmlctl.agent.zygote`); the
agent server is shared only by launches that
agree on them (:mod:`dmlctl.transport.agent_server`)."""

from __future__ import annotations

# What the interpreter, libgomp or torch read while they start ...
_AT_START = (
    *("PYTHON", "LD_", "LC_", "LANG", "TZ", "TORCH", "PYTORCH"),
    *("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "MALLOC_"),
)
# ... except these: read later, or applied to a forked rank (PYTHONPATH, OMP_NUM_THREADS).
_LATER = (
    *("PYTHONPATH", "PYTHONUNBUFFERED", "OMP_NUM_THREADS"),
    *("TORCHELASTIC_", "TORCH_ELASTIC_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCH_GLOO_"),
    "TORCH_FR_",
)


def read_at_start(key: str) -> bool:
    """Whether the variable ``key`` is read as the interpreter or torch starts (then a
    process forked from this one has it as this one had it)."""
    return key.startswith(_AT_START) and not key.startswith(_LATER)
