"""``reinforce_is`` (verl's bypass_mode loss_type=reinforce) by hand: −sg[w]·Â·lp, w the IS weight of π_θ against
π_old per sequence (product of the token ratios) or per token, truncated at C or masked outside [C_low, C]."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms import PolicyBatch, get_objective

# 2 completions x 3 tokens (the second has 2); log-ratios lp − old per token
D = [[0.5, 0.4, -0.1], [-1.0, -0.8, 0.7]]  # (the 0.7 is padding: it must not count)
LP = torch.tensor([[-0.5, -1.0, -2.0], [-0.3, -0.7, -1.1]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
ADV = torch.tensor([1.5, -2.0], dtype=torch.float64)


def loss_and_grad(**overrides):
    lp = LP.clone().requires_grad_(True)
    old = LP - torch.tensor(D, dtype=torch.float64)
    batch = PolicyBatch(logprobs=lp, old_logprobs=old, advantages=ADV, mask=MASK, max_length=3)
    loss, metrics = get_objective("reinforce_is", **overrides).loss(batch)
    (g,) = torch.autograd.grad(loss, lp)
    return loss.item(), g, metrics


def by_hand(weights):
    """token-mean of −w_it·Â_i·lp_it over the 5 tokens, and its gradient −w_it·Â_i/5."""
    tokens = [(i, t) for i in range(2) for t in range(3) if MASK[i, t] > 0]
    loss = sum(-weights[i][t] * ADV[i].item() * LP[i, t].item() for i, t in tokens) / len(tokens)
    grad = torch.zeros(2, 3, dtype=torch.float64)
    for i, t in tokens:
        grad[i, t] = -weights[i][t] * ADV[i].item() / len(tokens)
    return loss, grad


def check(weights, **overrides):
    loss, grad, _ = loss_and_grad(**overrides)
    want_loss, want_grad = by_hand(weights)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)


def test_sequence_weight_is_the_product_of_the_token_ratios_truncated_at_c():
    """Row 0: exp(0.8) = 2.23 > C = 2 → 2; row 1: exp(−1.8) = 0.165 (its padding token not counted). Wrong lines: the
    geometric mean exp(mean_t), the padding in the sum, no truncation, a weight that carries gradient."""
    w0, w1 = 2.0, math.exp(-1.8)
    check([[w0] * 3, [w1] * 3])


def test_token_weights_truncated():
    w = [[min(math.exp(d), 1.5) for d in row] for row in D]
    check(w, is_level="token", is_cap=1.5)


def test_token_mask_drops_weights_outside_the_band_both_sides():
    """Band [0.5, 1.6]: exp(0.5) = 1.65 dropped (above), exp(−1.0) = 0.37 and exp(−0.8) = 0.45 dropped (below)."""
    w = [[0.0, math.exp(0.4), math.exp(-0.1)], [0.0, 0.0, 1.0]]
    check(w, is_level="token", is_mode="mask", is_cap=1.6, is_floor=0.5)


def test_sequence_mask():
    """Band [0.5, 2.5]: row 0 (2.23) kept whole, row 1 (0.165) dropped whole."""
    check([[math.exp(0.8)] * 3, [0.0] * 3], is_mode="mask", is_cap=2.5)


def test_no_weight_is_plain_reinforce():
    check([[1.0] * 3, [1.0] * 3], is_level="none")


def test_the_cut_fractions_are_the_clip_metrics():
    *_, m = loss_and_grad(is_level="token", is_mode="mask", is_cap=1.6, is_floor=0.5)
    assert m["objective/clip_frac_high"].item() == pytest.approx(1 / 5)
    assert m["objective/clip_frac_low"].item() == pytest.approx(2 / 5)


@pytest.mark.parametrize("overrides,field", [
    ({"is_floor": 0.3}, "is_floor"), ({"is_level": "none", "is_cap": 3.0}, "is_level"),
    ({"ratio_level": "sequence"}, "ratio_level"), ({"is_mode": "mask", "is_floor": 2.0}, "is_floor"),
])
def test_settings_that_would_not_act_are_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        get_objective("reinforce_is", **overrides)
