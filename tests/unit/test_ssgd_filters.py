"""ssgd's int8 / topk / sign filters without processes: what a worker's bytes hold,
what they decode to, and the error each keeps for the next step."""

from __future__ import annotations

import pytest
import torch

from dmlctl.runtime.filters import FilterState, decode, encode, filter_bytes


def grads(n: int = 1000, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("kind", "sizes"), [("int8", [1000]), ("topk", [1000]), ("sign", [600, 400])]
)
def test_payload_is_exactly_the_counted_bytes_and_decodes_to_what_was_sent(
    kind: str, sizes: list[int]
) -> None:
    state = FilterState(kind, density=0.05)
    x = grads(sum(sizes))
    payload, sent = encode(state, x, sizes)
    assert payload.dtype == torch.uint8
    assert payload.numel() == filter_bytes(kind, x.numel(), 0.05, len(sizes))
    assert torch.equal(decode(state, payload, sizes), sent)


def test_int8_rounds_to_within_half_a_step_of_the_scale() -> None:
    x = grads()
    _, sent = encode(FilterState("int8"), x, [x.numel()])
    step = x.abs().max() / 127
    assert (sent - x).abs().max() <= step / 2 + 1e-6
    assert torch.isclose(sent.abs().max(), x.abs().max())


def test_int8_stochastic_rounding_is_unbiased() -> None:
    x = torch.full((20_000,), 0.3) * torch.tensor([1.0, -1.0]).repeat(10_000)
    x[0] = 127.0  # scale 1: every 0.3 rounds to 0 or 1 at random
    state = FilterState("int8", stochastic=True, seed=3)
    _, sent = encode(state, x, [x.numel()])
    assert set(sent[1:].abs().unique().tolist()) == {0.0, 1.0}
    assert sent[2::2].mean().item() == pytest.approx(0.3, abs=0.02)


def test_topk_keeps_the_largest_entries_and_carries_the_rest() -> None:
    state = FilterState("topk", density=0.01)
    x = grads()
    value = state.with_error(0, x)
    _, sent = encode(state, value, [1000])
    state.keep_error(0, value, sent)
    kept = sent.ne(0)
    assert int(kept.sum()) == 10
    assert x.abs()[kept].min() >= x.abs()[~kept].max()
    assert torch.equal(state.error[0] + sent, x)  # nothing lost, only delayed
    assert torch.equal(state.with_error(0, x), x + state.error[0])


def test_sign_scales_each_tensor_by_its_mean_magnitude() -> None:
    x = torch.cat([grads(600), 100 * grads(400, seed=1)])
    _, sent = encode(FilterState("sign"), x, [600, 400])
    assert torch.equal(sent.sign(), torch.where(x >= 0, 1.0, -1.0))
    assert sent[:600].abs().unique().item() == pytest.approx(x[:600].abs().mean().item())
    assert sent[600:].abs().unique().item() == pytest.approx(x[600:].abs().mean().item())


def test_error_buffers_travel_in_the_state_and_reset_on_a_new_layout() -> None:
    state = FilterState("sign")
    state.keep_error(3, grads(8), torch.zeros(8))
    copy = FilterState("sign")
    copy.load_state_dict(state.state_dict())
    assert torch.equal(copy.error[3], state.error[3])
    assert torch.equal(copy.with_error(3, torch.zeros(5)), torch.zeros(5))  # other size: dropped
    with pytest.raises(ValueError, match="not 'topk'"):
        FilterState("topk").load_state_dict(state.state_dict())
    no_feedback = FilterState("topk", error_feedback=False)
    no_feedback.keep_error(0, grads(8), torch.zeros(8))
    assert no_feedback.error == {}
