"""The per-token optimal baselines (``optimal-token-baseline``, ``tir-optimal-token-baseline``): hand-computed small
groups; which objectives may select them (``Objective.advantages_from_token_stats``, the loss on
``PolicyBatch.token_advantages``) and which refuse, and why. Parity with verl: tests/verl/test_verl_token_baseline.py;
the native engine's step: tests/bench/test_token_advantages.py."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms import TOKEN_ESTIMATORS, estimator_names, get_objective, group_advantages, token_baseline_advantages
from algorithms.advantages import register_advantage, sum_pi_squared
from bench.cli import main

OTB, TIR = TOKEN_ESTIMATORS


def pi_s2(w: float) -> tuple[float, float]:
    """(log π_old(y), Σπ²) of a distribution that exists, whose weight 1 − 2π + Σπ² is ``w`` (0.5 or 1): π = (½, ½)
    gives 1 − 1 + ½; π(y) = ¼ with Σπ² = ½ (¼, ≈0.655, ≈0.095) gives 1 − ½ + ½."""
    pi = 0.5 if w < 1 else 0.25
    return math.log(pi), w - 1 + 2 * pi


def group(ws: list[list[float]], rewards: list[float], T: int = 3):
    """One group (P = 1): completion i has len(ws[i]) tokens with weights ws[i] and its outcome reward on its last
    token; padding holds garbage that must not count."""
    G = len(ws)
    r = torch.full((1, G, T), 7.0, dtype=torch.float64)
    old = torch.full((1, G, T), -0.01, dtype=torch.float64)
    s2 = torch.full((1, G, T), 0.9, dtype=torch.float64)
    mask = torch.zeros(1, G, T, dtype=torch.float64)
    for i, (wi, ri) in enumerate(zip(ws, rewards)):
        n = len(wi)
        mask[0, i, :n] = 1.0
        r[0, i, :n] = 0.0
        r[0, i, n - 1] = ri
        for t, w in enumerate(wi):
            old[0, i, t], s2[0, i, t] = pi_s2(w)
    return r, mask, old, s2


# completion 0: R = 1, weights 1, 0.5, 1 (W = 1, 1.5, 2.5); completion 1: R = 0, weights 0.5, 1 (W = 0.5, 1.5)
CASE = group([[1.0, 0.5, 1.0], [0.5, 1.0]], [1.0, 0.0])
# B_0 = (1·1 + 0·0.5) / (1 + 0.5) = 2/3; B_1 = (1·1.5) / (1.5 + 1.5) = 1/2; B_2: only completion 0 is that long
WANT = [[1 - 2 / 3, 1 - 1 / 2, 1.0], [0 - 2 / 3, 0 - 1 / 2, 0.0]]


def adv(estimator, case=CASE, **kw):
    return token_baseline_advantages(estimator, *case, **kw)[0][0].tolist()


def close(a, b, tol=1e-7):
    for ra, rb in zip(a, b):
        assert ra == pytest.approx(rb, abs=tol)


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
def test_the_baseline_weighs_each_return_by_its_running_path_weight(estimator):
    """Â = G − B_t with B_t = Σ W G / Σ W over the group at t: a flipped sign, the plain group mean (B = ½, ½), the
    per-step weight in place of the running sum (B_1 = 1/3) or 1 − π + Σπ² for w each give other numbers."""
    close(adv(estimator), WANT)


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
def test_zero_tail(estimator):
    """The strictly longest completion gets no baseline past the second longest (B_2 = 1 would leave Â ≈ 0); without
    it, B_2 is its own return."""
    close(adv(estimator), WANT)
    close(adv(estimator, zero_tail=False), [WANT[0][:2] + [1 - 2.5 / (2.5 + 1e-8)], WANT[1]])
    tie = group([[1.0, 1.0], [1.0, 1.0], [1.0]], [1.0, 0.0, 0.0])  # two longest: nothing to cut
    # B_0 = 1/3 (three W = 1), B_1 = 2/4 (W = 2, 2; the third has ended)
    close(adv(estimator, tie), [[2 / 3, 1 / 2, 0.0], [-1 / 3, -1 / 2, 0.0], [-1 / 3, 0.0, 0.0]])


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
def test_a_group_of_one_keeps_its_return(estimator):
    one = group([[0.5, 1.0]], [0.7])
    close(adv(estimator, one), [[0.7, 0.7, 0.0]])


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
def test_padding_never_counts(estimator):
    """``group`` fills padding with garbage rewards and weights; with zeros there the advantages are the same, and
    they are 0 on padding."""
    r, mask, old, s2 = CASE
    clean = [torch.where(mask > 0, x, torch.zeros_like(x)) for x in (r, old, s2)]
    close(adv(estimator, (clean[0], mask, clean[1], clean[2])), WANT)
    assert adv(estimator)[1][2] == 0.0


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
def test_importance_weights_scale_the_path_weight_by_their_square(estimator):
    r, mask, old, s2 = CASE
    rho = torch.ones_like(r)
    rho[0, 1, 0] = 2.0  # completion 1's first weight: 0.5·4 = 2, so W = 2, 3
    # B_0 = 1 / (1 + 2) = 1/3; B_1 = 1.5 / (1.5 + 3) = 1/3
    close(adv(estimator, is_weights=rho), [[2 / 3, 2 / 3, 1.0], [-1 / 3, -1 / 3, 0.0]])


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
def test_dense_rewards_give_returns_to_go(estimator):
    r, mask, old, s2 = CASE
    r = r.clone()
    r[0, 0, 0] = 0.5  # completion 0: returns 1.5, 1, 1
    # B_0 = (1.5·1) / 1.5 = 1; B_1 = 1/2
    advantages, returns = token_baseline_advantages(estimator, r, mask, old, s2)
    close(returns[0].tolist(), [[1.5, 1.0, 1.0], [0.0, 0.0, 0.0]])
    close(advantages[0].tolist(), [[0.5, 0.5, 1.0], [-1.0, -0.5, 0.0]])


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
def test_the_advantages_are_constants(estimator):
    r, mask, old, s2 = CASE
    old, s2 = old.clone().requires_grad_(True), s2.clone().requires_grad_(True)
    advantages, returns = token_baseline_advantages(estimator, r, mask, old, s2)
    assert not advantages.requires_grad and not returns.requires_grad


def test_tir_aligns_the_group_by_counted_token_not_by_position():
    """Completion 0 has a tool output at position 1 (mask 1, 0, 1, 1): its 2nd counted token is at position 2. TIR
    compares it with completion 1's 2nd token; the position-aligned estimator compares position 2 with nothing."""
    r = torch.zeros(1, 2, 4, dtype=torch.float64)
    r[0, 0, 3], r[0, 1, 2] = 1.0, 0.0
    mask = torch.tensor([[[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]]], dtype=torch.float64)
    old, s2 = (torch.full_like(r, v) for v in pi_s2(1.0))  # every weight 1
    tir = token_baseline_advantages(TIR, r, mask, old, s2, zero_tail=False)[0][0].tolist()
    # counted token k: W = k + 1 for both; B_k = (k + 1) / (2k + 2) = 1/2 at k = 0, 1, 2
    close(tir, [[0.5, 0.0, 0.5, 0.5], [-0.5, -0.5, -0.5, 0.0]])
    otb = token_baseline_advantages(OTB, r, mask, old, s2, zero_tail=False)[0][0].tolist()
    # position: completion 0's W = 1, 1, 2, 3 (counted at 0, 2, 3); completion 1's 1, 2, 3 (at 0, 1, 2)
    # B_0 = 1/2, B_1 = 0 / 2 = 0 (only completion 1 counts), B_2 = 2 / (2 + 3) = 2/5, B_3 = 3 / 3 = 1
    close(otb, [[0.5, 0.0, 0.6, 0.0], [-0.5, 0.0, -0.4, 0.0]])


def test_tir_leaves_empty_completions_out_of_the_group():
    """A completion with no tokens is no member: its group of two is a group of one, whose other completion keeps
    its return (the position-aligned estimator counts it, so its baseline is the other's own return)."""
    r, mask, old, s2 = group([[1.0, 1.0], [1.0]], [1.0, 0.0])
    mask[0, 1] = 0.0
    close(token_baseline_advantages(TIR, r, mask, old, s2, zero_tail=False)[0][0].tolist(),
          [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    otb = token_baseline_advantages(OTB, r, mask, old, s2, zero_tail=False)[0][0].tolist()
    close(otb, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], tol=1e-6)


def test_sum_pi_squared():
    logits = torch.tensor([[0.0, math.log(3.0)], [5.0, 5.0]], dtype=torch.float64)  # π = (1/4, 3/4), (1/2, 1/2)
    close([sum_pi_squared(logits).tolist()], [[1 / 16 + 9 / 16, 1 / 2]])


def test_inputs_are_checked():
    r, mask, old, s2 = CASE
    with pytest.raises(ValueError, match="did you mean 'optimal-token-baseline'"):
        token_baseline_advantages("optimal-token-basline", r, mask, old, s2)
    with pytest.raises(ValueError, match="sum_pi_squared must have the shape"):
        token_baseline_advantages(OTB, r, mask, old, s2[..., :2])
    with pytest.raises(ValueError, match=r"shape \(prompts, group_size, tokens\)"):
        token_baseline_advantages(OTB, r[0], mask[0], old[0], s2[0])


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
def test_an_objective_selects_a_per_token_estimator_by_its_advantage_estimator(estimator):
    """Valid names now: grpo with one reads token_advantages and declares what the engine must score; the per-completion
    path (group_advantages) still refuses them with the reason, and a plugin cannot take their names."""
    assert estimator in estimator_names()
    obj = get_objective("grpo", advantage_estimator=estimator)
    assert obj.token_estimator == estimator and obj.uses_token_advantages
    assert "token_advantages" in obj.batch_fields
    assert obj.token_advantage_needs == ("old_logprobs", "sum_pi_squared")
    plain = get_objective("grpo")
    assert plain.token_estimator is None and not plain.uses_token_advantages and plain.token_advantage_needs == ()
    with pytest.raises(ValueError, match="one advantage per TOKEN"):
        group_advantages(torch.zeros(2, 3), estimator)
    with pytest.raises(ValueError, match="already registered"):
        register_advantage(estimator, lambda rewards: rewards, description="x")


@pytest.mark.parametrize("name, why", [
    ("tepo", "likelihood credit"), ("clip_cov", "covariance"), ("kl_cov", "covariance"), ("gmpo", "sequence ratio"),
    ("vespo", "sign of the per-completion"), ("topr", "tapers a whole completion"), ("ppo", "GAE"),
])
def test_objectives_whose_loss_reads_the_per_completion_advantage_refuse_them(name, why):
    with pytest.raises(ValueError, match=why):
        get_objective(name, advantage_estimator=OTB)


def test_the_off_policy_mask_is_refused_with_a_per_token_estimator():
    """The mask drops sequences with Â_i < 0: with per-token advantages there is no Â_i to read."""
    with pytest.raises(ValueError, match="off_policy_mask_threshold.*one advantage per completion"):
        get_objective("grpo", advantage_estimator=OTB, off_policy_mask_threshold=0.5)
    get_objective("grpo", off_policy_mask_threshold=0.5)  # (without one: as before)


def test_advantages_from_token_stats_groups_rows_and_puts_the_reward_on_the_last_token():
    """(N,) rewards of P·G prompt-major rows -> the (P, G, T) computation, reshaped; (N, 1) IS weights broadcast."""
    obj = get_objective("dr_grpo", advantage_estimator=OTB)
    g = torch.Generator().manual_seed(0)
    P, G, T = 3, 4, 5
    lengths = torch.randint(1, T + 1, (P * G,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    rewards = torch.randint(0, 2, (P * G,), generator=g).to(torch.float64)
    old = -torch.rand(P * G, T, generator=g, dtype=torch.float64) * mask
    s2 = (old.exp() ** 2 + 0.1) * mask
    rho = 0.5 + torch.rand(P * G, 1, generator=g, dtype=torch.float64)
    got = obj.advantages_from_token_stats(rewards, mask, old, s2, group_size=G, is_weights=rho)
    r = torch.zeros(P * G, T, dtype=torch.float64)
    r[torch.arange(P * G), lengths - 1] = rewards
    want = token_baseline_advantages(OTB, r.view(P, G, T), mask.view(P, G, T), old.view(P, G, T), s2.view(P, G, T),
                                     is_weights=rho.expand(P * G, T).reshape(P, G, T))[0].view(P * G, T)
    torch.testing.assert_close(got, want)
    assert not torch.equal(got, obj.advantages_from_token_stats(rewards, mask, old, s2, group_size=G))  # ρ counts
    with pytest.raises(ValueError, match="groups of 5"):
        obj.advantages_from_token_stats(rewards, mask, old, s2, group_size=5)
    with pytest.raises(ValueError, match="not a per-token estimator"):
        get_objective("dr_grpo").advantages_from_token_stats(rewards, mask, old, s2, group_size=G)


@pytest.mark.parametrize("name", ["grpo", "gspo", "cispo", "dppo_tv", "forking_tokens"])
def test_the_loss_reads_token_advantages_in_place_of_the_broadcast_one(name):
    """With a per-token estimator the loss is the one on PolicyBatch.token_advantages: equal to the plain objective's
    when Â_it = Â_i on every token, and it moves with Â_it (PolicyBatch.advantages unread)."""
    from algorithms import PolicyBatch

    g = torch.Generator().manual_seed(1)
    B, T = 4, 6
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[1, 4:] = 0
    lp = (-torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = lp.detach() - 0.05 * torch.randn(B, T, generator=g, dtype=torch.float64)
    a = torch.tensor([1.0, -0.5, 0.25, -1.0], dtype=torch.float64)

    def batch(adv, tok=None):
        return PolicyBatch(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, max_length=T,
                           ref_logprobs=old, entropy=lp.detach(), old_entropy=-old, token_advantages=tok)

    gen = torch.Generator().manual_seed(0)
    plain = get_objective(name).checked_loss(batch(a), generator=gen)[0]
    obj = get_objective(name, advantage_estimator=OTB)
    tok = a[:, None].expand(B, T).clone()
    same = obj.checked_loss(batch(torch.zeros(B), tok), generator=torch.Generator().manual_seed(0))[0]
    torch.testing.assert_close(same, plain)
    tok = tok + torch.linspace(0.5, 3.0, B * T, dtype=torch.float64).view(B, T)  # every token moves
    moved = obj.checked_loss(batch(a, tok), generator=torch.Generator().manual_seed(0))[0]
    assert not torch.allclose(moved, plain)
    with pytest.raises(ValueError, match="token_advantages"):
        obj.checked_loss(batch(a))


def test_bench_list_names_them(capsys):
    assert main(["list"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("per-token advantage estimators")]
    assert len(line) == 1 and all(e in line[0] for e in TOKEN_ESTIMATORS)
    assert "advantage_estimator" in line[0] and "not selectable" not in line[0]
