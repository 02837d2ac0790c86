"""What the strategies read from the user's optimizer to derive their defaults
(runtime side only: imports torch).

* :func:`family` — ``sgd`` (plain SGD), ``momentum`` (SGD with momentum or Nesterov),
  ``adaptive`` (Adam, AdamW and the others that scale each coordinate by its
  gradients' history), or ``None`` for an optimizer dmlctl does not know;
* :func:`first_lr` — the ``lr`` the defaults start from;
* :func:`effective_lr` — how far one unit of gradient moves the parameters in the
  steady state: ``lr`` for plain SGD, ``lr (1 − dampening) / (1 − momentum)`` with
  momentum, ``None`` for the adaptive family (its step does not scale with the
  gradient);
* :func:`carries_momentum` — whether each update already carries on into later steps
  (SGD with momentum or Nesterov, Adam's first moment ``β₁ > 0``, RMSprop's momentum);
* :func:`describe` — ``"SGD (lr 0.05, momentum 0.9)"``, for messages.

The rules that use them, and why, are in ``docs/strategies.md`` ("Defaults and your
optimizer"). The control plane never imports this module.
"""

from __future__ import annotations

from typing import Literal

import torch

Family = Literal["sgd", "momentum", "adaptive"]

ADAPTIVE = frozenset(
    {"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "SparseAdam"}
)
"""torch.optim classes of the adaptive family (by name: subclasses count too)."""


def _group(optimizer: torch.optim.Optimizer) -> dict[str, object]:
    return dict(optimizer.param_groups[0]) if optimizer.param_groups else {}


def family(optimizer: torch.optim.Optimizer) -> Family | None:
    """The optimizer's family (module docstring), from its class and first param
    group; None when neither says (a custom optimizer)."""
    names = {cls.__name__ for cls in type(optimizer).__mro__}
    group = _group(optimizer)
    if names & ADAPTIVE or "betas" in group:
        return "adaptive"
    if "SGD" in names:
        momentum = float(group.get("momentum", 0.0) or 0.0)  # type: ignore[arg-type]
        return "momentum" if momentum > 0 else "sgd"
    return None


def first_lr(optimizer: torch.optim.Optimizer) -> float:
    """The ``lr`` of the optimizer's first param group (0.0 when it has none): what
    strategies derive their defaults from (EASGD's ρ, AdaDelay's L, ADMM's ρ)."""
    return float(_group(optimizer).get("lr", 0.0))  # type: ignore[arg-type]


def effective_lr(optimizer: torch.optim.Optimizer) -> float | None:
    """Steady-state step per unit of gradient for the SGD families (module
    docstring); None for the adaptive family and unknown optimizers."""
    kind = family(optimizer)
    lr = first_lr(optimizer)
    if kind == "sgd":
        return lr
    if kind == "momentum":
        group = _group(optimizer)
        momentum = float(group.get("momentum", 0.0))  # type: ignore[arg-type]
        dampening = float(group.get("dampening", 0.0) or 0.0)  # type: ignore[arg-type]
        return lr * (1.0 - dampening) / (1.0 - momentum) if momentum < 1 else None
    return None


def carries_momentum(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer keeps a running average of its gradients, so that an
    update goes on moving the parameters in later steps: ``momentum > 0`` (SGD,
    RMSprop) or ``betas[0] > 0`` (Adam, AdamW, NAdam, RAdam, Adamax)."""
    group = _group(optimizer)
    momentum = float(group.get("momentum", 0.0) or 0.0)  # type: ignore[arg-type]
    betas = group.get("betas")
    beta1 = float(betas[0]) if isinstance(betas, tuple | list) and betas else 0.0
    return momentum > 0 or beta1 > 0


def describe(optimizer: torch.optim.Optimizer) -> str:
    """``Name (lr …[, momentum …][, nesterov])`` of the optimizer, for messages."""
    group = _group(optimizer)
    parts = [f"lr {first_lr(optimizer):g}"]
    momentum = float(group.get("momentum", 0.0) or 0.0)  # type: ignore[arg-type]
    if momentum > 0 and family(optimizer) != "adaptive":
        parts.append(f"momentum {momentum:g}")
    if group.get("nesterov"):
        parts.append("nesterov")
    return f"{type(optimizer).__name__} ({', '.join(parts)})"
