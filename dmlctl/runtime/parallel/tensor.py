"""Tensor parallelism: dmlctl's default plan for ``parallelize_module``.

Without a ``parallelize:`` function of the job's, a model is split by these rules
(docs/parallelism.md), applied to every module under it:

* **Naming convention.** An ``nn.Linear`` whose own name is one of :data:`COLWISE`
  (``wq``, ``wk``, ``wv``, ``w1``, ``w3``, ``fc1``, ``q_proj``, ``up_proj``, …) is split
  by output features (``ColwiseParallel``: each rank holds ``out/tp`` rows, its output
  is the matching slice); one named in :data:`ROWWISE` (``wo``, ``w2``, ``fc2``,
  ``o_proj``, ``down_proj``, …) by input features (``RowwiseParallel``: partial
  products summed across the ranks, the output whole). Attention modules must then
  reshape with ``-1`` heads (``view(b, s, -1, head_dim)``): each rank holds
  ``heads/tp`` of them.
* **Sequential stacks.** In an ``nn.Sequential``, a ``Linear`` followed by another
  one with only element-wise modules between them (activations, dropout) forms a
  pair: the first column-wise, the second row-wise — the Megatron MLP split, one
  all-reduce per pair in the forward pass.

A linear layer whose split size is not divisible by the degree stays replicated.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

COLWISE = frozenset(
    {
        "wq",
        "wk",
        "wv",
        "w1",
        "w3",
        "fc1",
        "q_proj",
        "k_proj",
        "v_proj",
        "up_proj",
        "gate_proj",
        "c_fc",
    }
)
"""Names of the linear layers split by output features."""
ROWWISE = frozenset({"wo", "w2", "fc2", "o_proj", "down_proj", "c_proj"})
"""Names of the linear layers split by input features."""
ELEMENTWISE = (
    nn.ReLU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.LeakyReLU,
    nn.Dropout,
    nn.Identity,
    nn.Mish,
    nn.ELU,
    nn.Softplus,
)
"""Modules a column-wise/row-wise pair may have between its two linear layers."""


def default_plan(model: nn.Module, degree: int) -> dict[str, ParallelStyle]:
    """The plan of this module's docstring for ``model``: qualified module name →
    style. Empty when nothing in the model can be split ``degree`` ways."""
    plan: dict[str, ParallelStyle] = {}
    for name, module in model.named_modules():
        leaf = name.rpartition(".")[2]
        if not isinstance(module, nn.Linear):
            continue
        if leaf in COLWISE and module.out_features % degree == 0:
            plan[name] = ColwiseParallel()
        elif leaf in ROWWISE and module.in_features % degree == 0:
            plan[name] = RowwiseParallel()
    for name, module in model.named_modules():
        if isinstance(module, nn.Sequential):
            plan.update(_sequential_pairs(name, module, degree, plan))
    return plan


def _sequential_pairs(
    prefix: str, seq: nn.Sequential, degree: int, taken: dict[str, ParallelStyle]
) -> dict[str, ParallelStyle]:
    """Column-wise/row-wise pairs of linear layers in ``seq`` (not already planned)."""
    out: dict[str, ParallelStyle] = {}
    first: str | None = None
    for child_name, child in seq.named_children():
        name = f"{prefix}.{child_name}" if prefix else child_name
        if isinstance(child, nn.Linear) and name not in taken:
            if first is not None and child.in_features % degree == 0:
                out[first], out[name] = ColwiseParallel(), RowwiseParallel()
                first = None
            elif child.out_features % degree == 0:
                first = name
            else:
                first = None
        elif not isinstance(child, ELEMENTWISE):
            first = None
    return out


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Split ``model`` over the 1-D tensor-parallel ``mesh`` with :func:`default_plan`;
    raises ValueError naming the rules when nothing in it can be split."""
    plan = default_plan(model, mesh.size())
    if not plan:
        raise ValueError(
            f"tensor_parallel_degree is {mesh.size()} but nothing in the model splits by "
            "dmlctl's default plan (linear layers named wq/wk/wv/wo, w1/w2/w3, fc1/fc2, "
            "…, or Linear → activation → Linear in an nn.Sequential, with sizes divisible "
            "by the degree); name the layers so, or give the job a "
            "'parallelize: FILE:FUNCTION' that splits the model (docs/parallelism.md)"
        )
    return parallelize_module(model, mesh, plan)
