"""Encoded parameter-server pushes without processes: the bytes a push takes, what the
server decodes, and the error the worker carries into its next push."""

from __future__ import annotations

import pytest
import torch

from dmlctl.ps.codec import PushCodec
from dmlctl.runtime.filters import filter_bytes
from dmlctl.strategies.asgd.params import Params


@pytest.mark.parametrize("kind", ["int8", "topk", "sign"])
def test_a_push_round_trips_and_carries_what_it_dropped(kind: str) -> None:
    worker = PushCodec({"kind": kind, "density": 0.1}, [[30, 70], []])
    server = PushCodec({"kind": kind, "density": 0.1}, [[30, 70], []])
    update = torch.randn(100, generator=torch.Generator().manual_seed(0))
    payload = worker.encode(0, update)
    assert payload.numel() == worker.nbytes(0) == filter_bytes(kind, 100, 0.1, 2)
    got = server.decode(0, payload, torch.float32)
    assert torch.allclose(got + worker.state.error[0], update, atol=1e-6)  # nothing lost
    again = server.decode(0, worker.encode(0, torch.zeros(100)), torch.float32)
    assert torch.allclose(got + again + worker.state.error[0], update, atol=1e-6)
    assert worker.encode(1, torch.empty(0)).numel() == 0  # an empty shard sends nothing


def test_push_compression_is_a_job_parameter_of_the_server_strategies() -> None:
    assert Params().push_spec() is None
    spec = Params.model_validate({"push_compression": "topk", "push_density": 0.05}).push_spec()
    assert spec == {"kind": "topk", "density": 0.05}
    with pytest.raises(ValueError, match="push_density only applies with push_compression: topk"):
        Params.model_validate({"push_compression": "int8", "push_density": 0.05})


def test_a_threshold_push_sends_only_the_tensors_that_changed_enough() -> None:
    """Three tensors (30, 70, 5 elements) of parameters 1.0: a change below 1 % of the
    norm is held back (0.6 %), one of 2 % is sent whole; held-back changes add up until they
    pass the threshold, and nothing is lost."""
    sizes = [[30, 70, 5]]
    worker = PushCodec({"kind": "threshold", "threshold": 0.01}, sizes)
    server = PushCodec({"kind": "threshold", "threshold": 0.01}, sizes)
    params = torch.ones(105)
    change = torch.cat([torch.full((30,), 0.006), torch.full((70,), 0.02), torch.zeros(5)])
    payload = worker.encode(0, change, params)
    assert payload.numel() == 1 + 4 * 70  # the mask, then tensor 1's values
    got = server.decode(0, payload, torch.float32)
    assert torch.equal(got[30:100], change[30:100]) and not got[:30].any() and not got[100:].any()
    assert torch.allclose(got + worker.state.error[0], change)
    again = worker.encode(0, change, params)  # tensor 0 now carries 1.2 %: sent
    assert again.numel() == 1 + 4 * (30 + 70)
    total = got + server.decode(0, again, torch.float32) + worker.state.error[0]
    assert torch.allclose(total, 2 * change)
    with pytest.raises(ValueError, match="needs the parameters"):
        worker.encode(0, change)


def test_push_threshold_is_a_job_parameter_of_the_server_strategies() -> None:
    spec = Params.model_validate({"push_compression": "threshold"}).push_spec()
    assert spec == {"kind": "threshold", "threshold": 0.01}
    custom = Params.model_validate({"push_compression": "threshold", "push_threshold": 0.1})
    assert custom.push_spec() == {"kind": "threshold", "threshold": 0.1}
    with pytest.raises(ValueError, match="push_threshold only applies with push_compression"):
        Params.model_validate({"push_compression": "topk", "push_threshold": 0.1})
