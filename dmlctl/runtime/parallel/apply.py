"""Applying a job's layout to a model and its optimizer (``ctx.prepare`` calls
:func:`parallelize` before the strategy wraps them).

In order, on each worker:

1. The job's ``parallelize: FILE:FUNCTION``, when it has one, is called as
   ``FUNCTION(model, mesh)``: it applies tensor parallelism (``mesh["tp"]``) the way
   the model needs and returns the model — or, under pipeline parallelism, may return
   this rank's stage modules itself (a list, in the order of its stage ids).
2. Pipeline stages: an ``nn.Sequential`` is cut into balanced stages
   (:func:`~.pipeline.split_sequential`); this rank keeps its own.
3. Tensor parallelism without a function of the job's: dmlctl's default plan on the
   model, or on each of this rank's stages (:func:`default_tensor_parallel`: a
   sequential convolutional network split as AlexNet's, :mod:`.convs`; linear layers
   by their names and pairs, :mod:`.tensor`).
4. Sharded data parallelism (``data_parallel_shard_degree`` > 1): ``fully_shard``
   over the shard dimension (with the replicate dimension: hybrid sharding).
5. The optimizer is rebuilt on this rank's parameters (they are new objects: DTensor
   shards, or a subset under a pipeline), same class, same hyperparameters, the
   param groups matched by parameter name.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from dmlctl.mesh import MeshLayout
from dmlctl.runtime.parallel.convs import split_network
from dmlctl.runtime.parallel.fsdp import shard_model
from dmlctl.runtime.parallel.pipeline import PipelinedModel, split_sequential
from dmlctl.runtime.parallel.tensor import apply_tensor_parallel
from dmlctl.text import plural

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context

Parallelize = Callable[[nn.Module, DeviceMesh], Any]


def lay_out(
    ctx: Context, model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """:func:`parallelize` with the context's layout, mesh and the job's function;
    says once what it did to the optimizer."""
    layout, mesh = ctx.layout, ctx.mesh
    assert layout is not None and mesh is not None
    spec = ctx.parallelize_function
    model, rebuilt = parallelize(
        model,
        optimizer,
        layout=layout,
        mesh=mesh,
        worker=ctx.rank,
        device=ctx.device,
        fsdp=ctx.fsdp,  # ssgd's capabilities; DistBelief's asgd keeps whole replicas
        function=load_function(spec) if spec else None,
    )
    ctx.notice(
        f"parallelism {' × '.join(f'{d} {layout.sizes[d]}' for d in layout.names)}: "
        f"{type(optimizer).__name__} rebuilt on each rank's own parameters "
        f"({plural(len(rebuilt.param_groups), 'param group')}, same hyperparameters)"
    )
    return model, rebuilt


def load_function(spec: str, workdir: str = ".") -> Parallelize:
    """The function ``FILE:FUNCTION`` names, FILE relative to ``workdir``; raises
    ValueError saying what is missing."""
    file, _, name = spec.rpartition(":")
    path = Path(workdir) / file
    if not file or not name or not path.is_file():
        raise ValueError(f"parallelize: {spec!r}: no file {path}")
    module_name = f"dmlctl_parallelize_{path.stem}"
    loader = importlib.util.spec_from_file_location(module_name, path)
    if loader is None or loader.loader is None:
        raise ValueError(f"parallelize: {spec!r}: {path} cannot be imported")
    module = sys.modules.get(module_name)
    if module is None:
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module
        loader.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"parallelize: {spec!r}: {path} has no function {name!r}")
    return fn  # type: ignore[no-any-return]


def parallelize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    layout: MeshLayout,
    mesh: DeviceMesh,
    worker: int,
    device: torch.device,
    fsdp: bool,
    function: Parallelize | None = None,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """``model`` laid out as the module docstring says for worker ``worker`` of
    ``layout`` (``fsdp``: shard over the data-parallel dimensions), and the optimizer
    rebuilt on its parameters."""
    names = {id(p): n for n, p in model.named_parameters()}
    stages: list[nn.Module] | None = None
    if function is not None:
        result = function(model, mesh)
        if isinstance(result, list | tuple):
            stages = list(result)
        elif isinstance(result, nn.Module):
            model = result
        else:
            raise ValueError(
                f"the parallelize function returned a {type(result).__name__}, not the "
                "model (or a list of this rank's pipeline stages)"
            )
    pp_rank = layout.coords(worker)["pp"]
    if layout.pp > 1 and stages is None:
        every = split_sequential(model, layout.n_stages)
        stages = [every[i] for i in layout.stages(pp_rank)]
    parts: list[nn.Module] = stages if stages is not None else [model]
    if layout.tp > 1 and function is None:
        parts = [default_tensor_parallel(part, mesh["tp"]) for part in parts]
    if fsdp and layout.dp_shard > 1:
        dims = ("dp_replicate", "dp_shard") if layout.dp_replicate > 1 else ("dp_shard",)
        parts = [shard_model(part, mesh[dims]) for part in parts]
    if layout.pp > 1:
        model = PipelinedModel(
            parts,
            layout.stages(pp_rank),
            layout.n_stages,
            group=mesh.get_group("pp"),
            schedule=layout.schedule,
            microbatches=layout.microbatches or 2 * layout.n_stages,
            device=device,
        )
    else:
        model = parts[0]
    return model, rebuild_optimizer(optimizer, names, _named(model))


def default_tensor_parallel(part: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """dmlctl's default tensor-parallel plan for ``part``: an ``nn.Sequential`` with
    convolutions is split as AlexNet split its network (:func:`.convs.split_network`:
    grouped convolutions by their groups, full ones by output channels, the first
    linear layer after them by rows); anything else by the linear layers' names and
    pairs (:func:`.tensor.apply_tensor_parallel`)."""
    if isinstance(part, nn.Sequential) and any(isinstance(m, nn.Conv2d) for m in part.modules()):
        return split_network(part, mesh)
    return apply_tensor_parallel(part, mesh)


def _named(model: nn.Module) -> dict[str, nn.Parameter]:
    """``model``'s parameters by their name in the whole model (a pipeline's stages
    keep the whole model's names under ``stages.<i>.``)."""
    out = {}
    for name, p in model.named_parameters():
        if isinstance(model, PipelinedModel):
            name = name.split(".", 2)[2]
        out[name] = p
    return out


def _mixes_dtensors(params: list[nn.Parameter]) -> bool:
    """Whether ``params`` hold both DTensors and plain tensors."""
    from torch.distributed.tensor import DTensor

    return len({isinstance(p, DTensor) for p in params}) > 1


def rebuild_optimizer(
    optimizer: torch.optim.Optimizer, names: dict[int, str], params: dict[str, nn.Parameter]
) -> torch.optim.Optimizer:
    """A new optimizer of ``optimizer``'s class and hyperparameters over ``params``
    (name → parameter), each in the param group its old parameter of that name was
    in (``names``: id of an old parameter → its name); groups left empty are
    dropped. Raises ValueError when the class cannot be built again so."""
    groups = []
    for group in optimizer.param_groups:
        mine = [params[names[id(p)]] for p in group["params"] if names.get(id(p)) in params]
        if mine:
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": mine})
    if not groups:  # a rank whose part holds no parameter still needs an optimizer
        groups = [{"params": [torch.zeros(0, requires_grad=True)]}]
    accepted = inspect.signature(type(optimizer)).parameters
    kwargs = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    if "foreach" in accepted and _mixes_dtensors(list(params.values())):
        # torch's foreach kernels (the default on CUDA) refuse a list that mixes
        # DTensors with plain tensors, as a tensor-parallel part's parameters do.
        for group in groups:
            group["foreach"] = False
    try:
        return type(optimizer)(groups, **kwargs)
    except TypeError as exc:
        raise ValueError(
            f"{type(optimizer).__name__} cannot be rebuilt on this rank's parameters "
            f"({exc}); model parallelism needs an optimizer built as "
            "Class(params, **hyperparameters)"
        ) from exc


def stage_modules(model: nn.Module) -> Sequence[nn.Module]:
    """The modules whose state a checkpoint holds: a pipeline's stages, else the model."""
    return list(model.stages) if isinstance(model, PipelinedModel) else [model]
