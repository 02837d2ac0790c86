"""Group-convolution parallelism: AlexNet's two-GPU split (Krizhevsky et al., 2012).

The network is cut vertically over a 1-D tensor-parallel mesh of ``tp`` ranks. A
grouped ``nn.Conv2d`` (``groups`` divisible by ``tp``) is split by its groups: rank
``r`` holds groups ``r·g/tp … (r+1)·g/tp − 1`` — its slice of the weight and bias —
takes its slice of the input channels and yields its slice of the output channels,
with no communication. A full convolution (``groups=1``, AlexNet's conv3) is split by
output channels: each rank computes its slice of the filters from *every* input
channel, so the channel slices are gathered before it — the only exchange between
convolutions. The first linear layer after the flattened features is split by rows
(each rank multiplies its own features; the partial products are summed across the
ranks) and the layers after it stay whole on every rank. :func:`split_network` does
all of that to an ``nn.Sequential``; :func:`plan_split` says what it will do (pure,
no ranks needed) and refuses what it cannot split with a ValueError.

Per training step: forward, one all-gather of the activations before each full
convolution that follows a split one and one all-reduce of the first linear layer's
output; backward, one reduce-scatter of each gathered activation's gradient (and an
all-reduce of the input's gradient, only when the input needs one and the first layer
is a full convolution), nothing else: each rank's parameter gradients are its own
slices, or identical on every rank for the layers kept whole.

Why DTensor rather than ``torch.distributed.nn.functional`` (deprecated in torch 2.13,
and its all-gather's backward always reduce-scatters, which is wrong when every rank
uses the gathered tensor alike): each exchange is a :class:`Relayout` of a local
activation between two DTensor placements, with the placement its gradient has, and
DTensor derives both collectives from them — all-gather forward and reduce-scatter
backward when the consumer is split (its gradients are partial sums), a plain slice
backward when the consumer is replicated. The split parameters are DTensors
(``Shard`` / ``Replicate``) under the whole model's names, as ``parallelize_module``
makes them, so sharded checkpoints (DCP) reshard them across layouts and the
strategies' gradient averaging sees their local shards.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
from torch.distributed.tensor import distribute_tensor as _distribute

from dmlctl.runtime.parallel.tensor import ELEMENTWISE

CHANNELS: Placement = Shard(1)
"""An activation split by channels (or by flattened features): rank ``r`` holds the
``r``-th contiguous slice."""
CHANNEL_LOCAL = (
    *ELEMENTWISE,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveAvgPool2d,
)
"""Modules that treat each channel on its own, so they run on a rank's slice as is."""

RelayoutKind = Literal["share", "scatter", "gather", "collect"]
RELAYOUTS: dict[RelayoutKind, tuple[Placement, Placement, Placement]] = {
    "share": (Replicate(), Replicate(), Partial()),
    "scatter": (Replicate(), CHANNELS, CHANNELS),
    "gather": (CHANNELS, Replicate(), Partial()),
    "collect": (CHANNELS, Replicate(), Replicate()),
}
"""Each exchange as (placement in, placement out, placement of the gradient out):

* ``share`` — a whole activation into a layer split by output channels: forward
  nothing, backward all-reduce (each rank's input gradient is a partial sum);
* ``scatter`` — a whole activation into a grouped layer: forward this rank's channel
  slice, backward all-gather of the slices' gradients;
* ``gather`` — channel slices into a layer split by output channels: forward
  all-gather, backward reduce-scatter;
* ``collect`` — channel slices into layers every rank runs whole (the model's output):
  forward all-gather, backward this rank's slice of the (identical) gradient.
"""
Action = Literal["keep", "split", "share", "scatter", "gather", "collect"]
"""What :func:`plan_split` does at a step: keep a child whole, split it, or put a
:class:`Relayout` of that kind in."""


def relayout(
    x: torch.Tensor,
    mesh: DeviceMesh,
    src: Placement,
    dst: Placement,
    grad: Placement,
) -> torch.Tensor:
    """This rank's part of ``x`` (laid out as ``src`` over ``mesh``) laid out as
    ``dst``, with autograd: the gradient coming back is taken as laid out ``grad`` and
    redistributed to ``src``. Collective over ``mesh`` when the layouts differ."""
    whole = DTensor.from_local(x, mesh, [src], run_check=False)
    return whole.redistribute(mesh, [dst]).to_local(grad_placements=[grad])


class Relayout(nn.Module):
    """One of the exchanges of :data:`RELAYOUTS` over the 1-D mesh ``mesh``."""

    def __init__(self, kind: RelayoutKind, mesh: DeviceMesh) -> None:
        super().__init__()
        self.kind, self.mesh = kind, mesh
        self.src, self.dst, self.grad = RELAYOUTS[kind]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`relayout` of ``x`` by this exchange."""
        return relayout(x, self.mesh, self.src, self.dst, self.grad)

    def extra_repr(self) -> str:
        return f"{self.kind}: {self.src} -> {self.dst}, grad {self.grad}, tp {self.mesh.size()}"


def _local(p: torch.Tensor) -> torch.Tensor:
    """The part of ``p`` this rank holds, differentiably (a DTensor's local shard)."""
    return p.to_local() if isinstance(p, DTensor) else p


def _distributed(
    p: torch.Tensor | None, mesh: DeviceMesh, placement: Placement
) -> nn.Parameter | None:
    """``p`` laid out as ``placement`` over ``mesh`` (rank 0's values), as a parameter
    (None for None: a layer without bias)."""
    return None if p is None else nn.Parameter(_distribute(p.detach(), mesh, [placement]))


def check_conv(conv: nn.Conv2d, degree: int, name: str = "conv") -> None:
    """Raises ValueError unless :class:`SplitConv2d` can split ``conv`` ``degree``
    ways: whole groups on every rank (``groups`` 1 or a multiple of ``degree``), output
    channels divisible by ``degree``, zero padding."""
    if conv.groups > 1 and conv.groups % degree:
        raise ValueError(
            f"{name} has groups={conv.groups}, not divisible by tensor_parallel_degree "
            f"{degree}: each rank must hold whole groups (make groups a multiple of the "
            "degree, or 1 to split the convolution by output channels)"
        )
    if conv.out_channels % degree:
        raise ValueError(
            f"{name} has {conv.out_channels} output channels, not divisible by "
            f"tensor_parallel_degree {degree}"
        )
    if conv.padding_mode != "zeros":
        raise ValueError(
            f"{name} pads with {conv.padding_mode!r}; a split convolution supports "
            "padding_mode='zeros' only"
        )


def check_rows(linear: nn.Linear, degree: int, name: str = "linear") -> None:
    """Raises ValueError unless :class:`RowSplitLinear` can split ``linear``'s input
    features ``degree`` ways."""
    if linear.in_features % degree:
        raise ValueError(
            f"{name} has {linear.in_features} input features, not divisible by "
            f"tensor_parallel_degree {degree}: it cannot be split by rows"
        )


class SplitConv2d(nn.Module):
    """``conv`` split over the 1-D mesh ``mesh`` by output channels, initialised from
    its weights (rank 0's): rank ``r`` holds the ``r``-th slice of ``weight`` and
    ``bias`` (``Shard(0)`` DTensors) and returns the ``r``-th slice of the output
    channels.

    A grouped ``conv`` (``groups`` = g, a multiple of the degree) holds g/tp whole
    groups and takes the ``r``-th slice of the input channels — the one its groups
    read; no communication. A full one (``groups=1``) takes every input channel, and
    its gradient for them is this rank's partial sum: a ``gather`` or ``share``
    :class:`Relayout` before it sums them. Raises ValueError (:func:`check_conv`)
    when ``conv`` cannot be split so."""

    def __init__(self, conv: nn.Conv2d, mesh: DeviceMesh) -> None:
        super().__init__()
        check_conv(conv, mesh.size())
        self.in_channels, self.out_channels, self.groups = (
            conv.in_channels,
            conv.out_channels,
            conv.groups,
        )
        self.kernel_size, self.stride, self.dilation = conv.kernel_size, conv.stride, conv.dilation
        self.padding = conv.padding
        self.local_groups = 1 if conv.groups == 1 else conv.groups // mesh.size()
        self.tp = mesh.size()
        self.weight = nn.Parameter(_distribute(conv.weight.detach(), mesh, [Shard(0)]))
        self.bias = _distributed(conv.bias, mesh, Shard(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's output channels from ``x`` (its input slice, or every channel)."""
        bias = None if self.bias is None else _local(self.bias)
        return F.conv2d(
            x,
            _local(self.weight),
            bias,
            self.stride,
            self.padding,
            self.dilation,
            self.local_groups,
        )

    def extra_repr(self) -> str:
        held = (
            f"{self.local_groups} of {self.groups} groups"
            if self.groups > 1
            else f"{self.out_channels // self.tp} of {self.out_channels} filters"
        )
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, groups={self.groups}: "
            f"holds {held} (tp {self.tp})"
        )


class RowSplitLinear(nn.Module):
    """``linear`` split over the 1-D mesh ``mesh`` by input features, initialised from
    its weights (rank 0's): rank ``r`` holds the ``r``-th column block of ``weight``
    (``Shard(1)``) and a whole ``bias`` (``Replicate``), takes the ``r``-th slice of
    the features and returns the whole output on every rank — the partial products
    summed by one all-reduce (backward: none). Raises ValueError (:func:`check_rows`)
    when ``in_features`` is not divisible by the degree."""

    def __init__(self, linear: nn.Linear, mesh: DeviceMesh) -> None:
        super().__init__()
        check_rows(linear, mesh.size())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.mesh = mesh
        self.weight = nn.Parameter(_distribute(linear.weight.detach(), mesh, [Shard(1)]))
        self.bias = _distributed(linear.bias, mesh, Replicate())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The whole output from this rank's ``x`` (its slice of the features)."""
        partial = F.linear(x, _local(self.weight))
        out = relayout(partial, self.mesh, Partial(), Replicate(), Replicate())
        return out if self.bias is None else out + _local(self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}: holds "
            f"{self.in_features // self.mesh.size()} input features (tp {self.mesh.size()})"
        )


def plan_split(model: nn.Module, degree: int) -> list[tuple[str, Action]]:
    """What :func:`split_network` does to ``model``'s children, in order: ``(name,
    action)`` for each child (``keep`` or ``split``) and ``(kind_child, kind)`` for each
    :class:`Relayout` it puts before a child (or ``collect_output`` at the end).

    Walking the children with the activation whole (``all``) or split by channels
    (``slice``), starting whole: convolutions are split (:class:`SplitConv2d`), with a
    ``gather``/``share`` before a full one and a ``scatter`` before a grouped one that
    meets a whole activation; channel-local modules and ``nn.Flatten(1)`` keep a slice;
    an ``nn.Linear`` on a slice is split by rows and makes it whole; anything on a
    whole activation is kept. Raises ValueError for a model that is not an
    ``nn.Sequential``, a layer :func:`check_conv` or :func:`check_rows` refuses, or any
    other module meeting a slice."""
    if not isinstance(model, nn.Sequential):
        raise ValueError(
            f"group-convolution parallelism splits an nn.Sequential by its children; "
            f"this model is a {type(model).__name__}"
        )
    plan: list[tuple[str, Action]] = []
    split = False  # whether the activation is split by channels here
    for name, child in model.named_children():
        if isinstance(child, nn.Conv2d):
            check_conv(child, degree, name)
            grouped = child.groups > 1
            if grouped != split:
                kind: Action = "scatter" if grouped else "gather"
                plan.append((f"{kind}_{name}", kind))
            elif not grouped:
                plan.append((f"share_{name}", "share"))
            plan.append((name, "split"))
            split = True
        elif not split or isinstance(child, CHANNEL_LOCAL) or _flattens(child):
            plan.append((name, "keep"))
        elif isinstance(child, nn.Linear):
            check_rows(child, degree, name)
            plan.append((name, "split"))
            split = False
        else:
            raise ValueError(
                f"{name} ({type(child).__name__}) meets an activation split by channels; "
                "only element-wise modules, pooling, nn.Flatten(1), convolutions and a "
                "linear layer may (put it after the first linear layer)"
            )
    if split:
        plan.append(("collect_output", "collect"))
    return plan


def _flattens(module: nn.Module) -> bool:
    """Whether ``module`` flattens (channels, height, width) channel-major into features."""
    return isinstance(module, nn.Flatten) and module.start_dim == 1 and module.end_dim == -1


def split_network(model: nn.Module, mesh: DeviceMesh) -> nn.Sequential:
    """``model`` (an ``nn.Sequential``) split over the 1-D tensor-parallel ``mesh`` as
    :func:`plan_split` says: a new ``nn.Sequential`` whose children keep their names
    (so do their parameters: a checkpoint's keys and the optimizer's groups match the
    whole model's) with the :class:`Relayout` exchanges between them. On every rank
    of ``mesh`` it computes what ``model`` computes. Raises ValueError as
    :func:`plan_split` does, or when ``mesh`` is not 1-D."""
    if mesh.ndim != 1:
        raise ValueError(
            f"split_network needs the 1-D tensor-parallel mesh (mesh['tp']), got {mesh}"
        )
    children = dict(model.named_children())
    parts: OrderedDict[str, nn.Module] = OrderedDict()
    for name, action in plan_split(model, mesh.size()):
        if action in RELAYOUTS:
            parts[name] = Relayout(action, mesh)
            continue
        child = children[name]
        if action == "keep":
            parts[name] = child
        elif isinstance(child, nn.Conv2d):
            parts[name] = SplitConv2d(child, mesh)
        else:  # plan_split splits convolutions and linear layers only
            parts[name] = RowSplitLinear(cast(nn.Linear, child), mesh)
    return nn.Sequential(parts)
