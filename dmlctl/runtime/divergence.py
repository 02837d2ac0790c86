"""The divergence guard: a run whose loss or parameters stop being finite ends, failed.

Two checks, both raising :class:`Diverged` in the rank (so the run's root cause is
``Diverged``, a user failure: the supervisor does not restart it, the run exits 1):

* **Logged losses** — :func:`check_logged`, run by ``Context.log`` on the values it
  already converted for the record (no extra device sync). A key counts as a loss
  when its name, lower-cased, is ``loss`` or ends in ``loss`` (``loss``,
  ``train_loss``, ``val/loss``, ``nll_loss``; see :func:`is_loss_key`). The record is
  written first, so the non-finite value shows in the metrics.
* **Parameters and exchanged buffers after a communication round** (constant and
  integer buffers are never judged: :mod:`dmlctl.runtime.buffers`) —
  :func:`check_tensors`, called by
  :meth:`~dmlctl.runtime.optimizer.StrategyOptimizer.check_finite` with the buffer the
  round already holds (the averaged flat buffer, the center, z, the pulled
  parameters): one ``isfinite`` reduction and one sync; only when it fails is the
  first non-finite tensor looked up and named.

The message is one line naming the strategy, the step, the parameter (or logged key),
what is wrong with it (how many of its values are NaN and how many infinite) and a
hint: the optimizer's learning rate and the strategy's coupling weights
(:func:`hint`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from dmlctl.text import plural


class Diverged(RuntimeError):
    """Training diverged: a logged loss or a parameter is NaN or infinite."""


def is_loss_key(name: str) -> bool:
    """Whether a logged metric named ``name`` is a loss: ``loss`` or any name ending in
    ``loss``, case-insensitive (``train_loss``, ``val/loss``, ``NLLLoss``)."""
    return name.lower().endswith("loss")


def is_finite(value: Any) -> bool:
    """Whether ``value`` (a number or a tensor of any shape) holds no NaN or inf.

    Non-numeric values (strings) count as finite. A tensor costs one reduction and one
    sync; a Python number none."""
    if isinstance(value, torch.Tensor):
        if not (value.is_floating_point() or value.is_complex()):
            return True
        return bool(torch.isfinite(value).all().item())
    if isinstance(value, bool | str):
        return True
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


def hint(optimizer: Any, coupling: Mapping[str, float] | None = None) -> str:
    """``lower the learning rate (lr=…)``, plus the strategy's ``coupling`` weights
    (name → value) when it has any; ``lr`` is the first param group's."""
    groups = getattr(optimizer, "param_groups", None) or [{}]
    lr = groups[0].get("lr")
    text = "lower the learning rate" + (f" (lr={lr:g})" if isinstance(lr, int | float) else "")
    if coupling:
        weights = ", ".join(f"{name}={value:g}" for name, value in coupling.items())
        text += f" or the coupling weights ({weights})"
    return text


def check_logged(
    values: Mapping[str, Any], *, strategy: str, step: int, advice: Callable[[], str]
) -> None:
    """Raise :class:`Diverged` when a loss key (:func:`is_loss_key`) of ``values`` is
    not finite; other keys are not checked. ``advice()`` (asked only then) ends the
    message."""
    for name, value in values.items():
        if is_loss_key(name) and not is_finite(value):
            raise Diverged(
                f"strategy {strategy}, step {step}: logged {name!r} is {value}; {advice()}"
            )


def check_tensors(
    values: torch.Tensor | Sequence[torch.Tensor],
    layout: Sequence[torch.Tensor],
    names: Mapping[int, str],
    *,
    strategy: str,
    step: int,
    where: str,
    advice: Callable[[], str],
) -> None:
    """Raise :class:`Diverged` when ``values`` holds a NaN or inf.

    ``values`` is one flat buffer laid out like ``layout`` (its tensors concatenated in
    order, as :func:`dmlctl.strategies.common.flat_params` makes it) or a list shaped
    like ``layout``. The message names the first non-finite tensor of ``layout`` by
    ``names`` (``id(tensor)`` → name; a tensor not in it by its position and shape).
    Finite values cost one ``isfinite`` reduction and one sync; ``advice()`` (asked
    only on failure) ends the message."""
    if isinstance(values, torch.Tensor):
        if is_finite(values):
            return
        parts: Sequence[torch.Tensor] = _split(values, layout)
    else:
        if all_finite(values):
            return
        parts = values
    index = next((i for i, part in enumerate(parts) if not is_finite(part)), None)
    if index is None:  # beyond the layout (a trailing scalar, say)
        what, why = "a value", ""
    else:
        tensor = layout[index]
        name = names.get(id(tensor), f"#{index} (shape {tuple(tensor.shape)})")
        kind = "parameter" if isinstance(tensor, torch.nn.Parameter) else "buffer"
        what, why = f"{kind} {name!r}", f" ({census(parts[index])})"
    raise Diverged(
        f"strategy {strategy}, step {step}: {what} is not finite {where}{why}; {advice()}"
    )


def census(values: torch.Tensor) -> str:
    """What is wrong with ``values``: ``3 NaN and 1 inf of 4096 values``."""
    nan = int(torch.isnan(values).sum().item())
    inf = int(torch.isinf(values).sum().item())
    bad = " and ".join(f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "inf")) if n)
    return f"{bad} of {plural(values.numel(), 'value')}"


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every tensor is finite, with one sync for the whole list."""
    flags = [torch.isfinite(t).all() for t in tensors if t.is_floating_point()]
    return not flags or bool(torch.stack(flags).all().item())


def _split(flat: torch.Tensor, layout: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` cut into one piece per tensor of ``layout`` (a shorter tail is cut
    short; elements beyond the layout are ignored)."""
    pieces, offset = [], 0
    for tensor in layout:
        n = tensor.numel()
        pieces.append(flat[offset : offset + n])
        offset += n
    return pieces
