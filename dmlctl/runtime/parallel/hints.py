"""What a failure under model parallelism means: hints added to torch's errors. Imports
nothing of torch's parallel APIs, so every rank can use it at no import cost."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

_RESHAPE = re.compile(r"shape '\[[^\]]*\]' is invalid for input of size \d+")


@contextmanager
def reshape_hint(degree: int) -> Iterator[None]:
    """Re-raise a reshape's size mismatch under tensor parallelism (``degree`` > 1) as a
    RuntimeError that says the likely cause: a module that reshapes into a fixed number
    of heads or features, while each rank holds only ``1/degree`` of them. Any other
    exception passes unchanged."""
    try:
        yield
    except RuntimeError as exc:
        if degree < 2 or not _RESHAPE.search(str(exc)):
            raise
        raise RuntimeError(
            f"{exc} — under tensor_parallel_degree {degree} each rank holds 1/{degree} of "
            "a split layer's outputs (attention: heads/tp of the heads), so reshape with "
            "-1 where the count of heads or features goes (view(b, s, -1, head_dim)), or "
            "give the job a 'parallelize: FILE:FUNCTION' that splits the model "
            "(docs/parallelism.md)"
        ) from exc
