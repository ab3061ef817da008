"""PPO's critic side by hand (algorithms/critic.py): GAE, the returns, the whitening, the clipped value loss. Each
case is small enough to compute on paper, and each one fails for a plausible wrong line: γ and λ swapped, a value
bootstrapped past the last token, padding inside the whitening, values that carry gradient into the advantages, the
value clip taken as min or on the wrong side. Parity with verl on random tensors: tests/verl/test_verl_gae.py."""

from __future__ import annotations

import pytest
import torch

from algorithms.critic import explained_variance, gae, masked_whiten, outcome_token_rewards, value_loss

D = torch.float64


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=D)


def test_gae_by_hand_gamma_and_lambda_in_their_places():
    # r = (0, 0, 1), V = (0.2, 0.5, 0.7), γ = 0.9, λ = 0.5:
    # δ2 = 1 − 0.7 = 0.3 (no V after the last token)       Â2 = 0.3
    # δ1 = 0.9·0.7 − 0.5 = 0.13                             Â1 = 0.13 + 0.45·0.3 = 0.265
    # δ0 = 0.9·0.5 − 0.2 = 0.25                             Â0 = 0.25 + 0.45·0.265 = 0.36925
    adv, ret = gae(t([[0, 0, 1]]), t([[0.2, 0.5, 0.7]]), t([[1, 1, 1]]), gamma=0.9, lam=0.5, whiten=False)
    torch.testing.assert_close(adv, t([[0.36925, 0.265, 0.3]]))
    torch.testing.assert_close(ret, t([[0.56925, 0.765, 1.0]]))  # Â + V


def test_gae_defaults_are_monte_carlo_minus_the_value():
    # γ = λ = 1: Â_t = R − V(s_t), G_t = R on every token
    adv, ret = gae(t([[0, 0, 2]]), t([[0.5, -1, 3]]), t([[1, 1, 1]]), whiten=False)
    torch.testing.assert_close(adv, t([[1.5, 3.0, -1.0]]))
    torch.testing.assert_close(ret, t([[2.0, 2.0, 2.0]]))


def test_no_value_is_bootstrapped_past_the_last_token():
    # the second row ends after 2 tokens; its padded position holds a value of 9 that must not enter:
    # Â1 = 1 − 0.5 = 0.5, Â0 = 0.9·0.5 − 0.2 + 0.45·0.5 = 0.475
    rewards = t([[0, 0, 1], [0, 1, 0]])
    values = t([[0.2, 0.5, 0.7], [0.2, 0.5, 9.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5, whiten=False)
    torch.testing.assert_close(adv[1], t([0.475, 0.5, 0.0]))
    torch.testing.assert_close(ret[1], t([0.675, 1.0, 0.0]))  # 0 on padding


def test_whitening_counts_completion_tokens_only():
    # raw advantages (1, 2, 3) and (4, ·, ·): mean 2.5, Bessel variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3
    raw = t([[1, 2, 3], [4, 77, -50]])
    mask = t([[1, 1, 1], [1, 0, 0]])
    want = (t([[1, 2, 3], [4, 2.5, 2.5]]) - 2.5) / torch.sqrt(torch.tensor(5 / 3 + 1e-8, dtype=D)) * mask
    torch.testing.assert_close(masked_whiten(raw, mask), want)
    # gae whitens its raw advantages the same way: γ = λ = 1, V = 0, outcome rewards 2 (3 tokens) and 4 (1 token)
    # give raw (2, 2, 2) and (4): mean 2.5, variance (3·0.25 + 2.25) / 3 = 1
    adv, _ = gae(t([[0, 0, 2], [4, 0, 0]]), torch.zeros(2, 3, dtype=D), mask)
    torch.testing.assert_close(adv, t([[-0.5, -0.5, -0.5], [1.5, 0, 0]]) / torch.sqrt(torch.tensor(1 + 1e-8, dtype=D)))


def test_values_are_constants_in_the_advantages():
    values = t([[0.2, 0.5, 0.7]]).requires_grad_(True)
    adv, ret = gae(t([[0, 0, 1]]), values, t([[1, 1, 1]]))
    assert not adv.requires_grad and not ret.requires_grad


def test_outcome_reward_sits_on_the_last_completion_token():
    mask = t([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    torch.testing.assert_close(outcome_token_rewards(t([2, -1, 5]), mask),
                               t([[0, 0, 2, 0], [-1, 0, 0, 0], [0, 0, 0, 0]]))


def test_value_loss_by_hand_clip_takes_the_larger_error():
    # c = 0.5, V_old = 0 on each token, token-mean over 3 tokens:
    #   V = 1.0, G = 2: unclipped (1 − 2)² = 1, clipped (0.5 − 2)² = 2.25 -> 2.25, no gradient (the clip saturates)
    #   V = 0.3, G = 2: inside the clip range -> 2.89, gradient 2·(0.3 − 2) = −3.4
    #   V = 1.0, G = 0: unclipped 1, clipped 0.25 -> 1, gradient 2·1 = 2
    vpred = t([[1.0, 0.3, 1.0]]).requires_grad_(True)
    loss, m = value_loss(vpred, t([[2.0, 2.0, 0.0]]), torch.zeros(1, 3, dtype=D), t([[1, 1, 1]]), clip=0.5)
    torch.testing.assert_close(loss, torch.tensor(0.5 * (2.25 + 2.89 + 1.0) / 3, dtype=D))
    (g,) = torch.autograd.grad(loss, vpred)
    torch.testing.assert_close(g, t([[0.0, -3.4, 2.0]]) * 0.5 / 3)
    torch.testing.assert_close(m["critic/value_clip_frac"], torch.tensor(1 / 3, dtype=D))


def test_value_loss_ignores_padding_and_follows_the_aggregation():
    vpred = t([[1.0, 0.0], [2.0, float("nan")]]).requires_grad_(True)
    mask = t([[1, 1], [1, 0]])
    returns, old = t([[0.0, 1.0], [0.0, 5.0]]), t([[1.0, 0.0], [2.0, 7.0]])
    # errors² 1, 1 | 4: token-mean ½·6/3, seq-mean-token-mean ½·(1 + 4)/2
    tm, _ = value_loss(vpred, returns, old, mask, clip=0.5)
    sm, _ = value_loss(vpred, returns, old, mask, clip=0.5, aggregation="seq-mean-token-mean")
    torch.testing.assert_close(tm, torch.tensor(1.0, dtype=D))
    torch.testing.assert_close(sm, torch.tensor(1.25, dtype=D))
    (g,) = torch.autograd.grad(tm, vpred)
    assert torch.isfinite(g).all() and g[1, 1] == 0


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_value_loss_without_clip_is_the_plain_squared_error(clip):
    vpred = t([[0.1, 0.2]]).requires_grad_(True)
    loss, _ = value_loss(vpred, t([[0.1, 0.4]]), t([[0.1, 0.2]]), t([[1, 1]]), clip=clip)
    torch.testing.assert_close(loss, torch.tensor(0.5 * 0.04 / 2, dtype=D))


def test_explained_variance():
    mask = t([[1, 1, 0], [1, 1, 0]])
    returns = t([[1, 2, 9], [3, 4, 9]])
    torch.testing.assert_close(explained_variance(returns, returns, mask), torch.tensor(1.0, dtype=D))
    torch.testing.assert_close(explained_variance(torch.full_like(returns, 2.5), returns, mask),
                               torch.tensor(0.0, dtype=D))
    assert torch.isnan(explained_variance(returns, torch.ones_like(returns), mask))
