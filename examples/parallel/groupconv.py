"""An AlexNet-like CNN for scikit-learn's 8×8 digits, split the way AlexNet was split
over two GPUs (Krizhevsky et al., 2012): its grouped convolutions (``conv2``,
``conv4``) put whole groups on each tensor-parallel rank, ``conv3`` reads every
channel (the one exchange between convolutions), the first linear layer is split by
rows. ``parallelize`` is the job's ``parallelize: groupconv.py:parallelize``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from dmlctl.runtime.parallel.convs import split_network


def network(seed: int = 0, groups: int = 2) -> nn.Sequential:
    """The CNN (≈ 25k parameters), initialised from ``seed``; ``groups`` of conv2 and
    conv4 (a multiple of the tensor-parallel degree)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(1, 16, 3, padding=1),  # full: every rank computes 8 filters
            relu1=nn.ReLU(),
            conv2=nn.Conv2d(16, 32, 3, padding=1, groups=groups),  # no communication
            relu2=nn.ReLU(),
            pool2=nn.MaxPool2d(2),
            conv3=nn.Conv2d(32, 32, 3, padding=1),  # full: the channels are gathered
            relu3=nn.ReLU(),
            conv4=nn.Conv2d(32, 32, 3, padding=1, groups=groups),  # no communication
            relu4=nn.ReLU(),
            pool4=nn.MaxPool2d(2),
            flatten=nn.Flatten(),
            fc1=nn.Linear(32 * 2 * 2, 64),  # by rows: partial products all-reduced
            relu5=nn.ReLU(),
            fc2=nn.Linear(64, 10),  # whole on every rank
        )
    )


def parallelize(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """``model`` split over the mesh's tensor-parallel dimension (unchanged without one)."""
    if "tp" not in (mesh.mesh_dim_names or ()):
        return model
    return split_network(model, mesh["tp"])
