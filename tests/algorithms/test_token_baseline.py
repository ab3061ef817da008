"""The per-token optimal baselines (``optimal-token-baseline``, ``tir-optimal-token-baseline``): hand-computed small
groups, and why no objective can select them. Parity with verl: tests/verl/test_verl_token_baseline.py."""

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
def test_no_objective_can_select_a_per_token_estimator(estimator):
    """Known names, refused with the reason (not 'unknown'): their advantages are (P, G, T), PolicyBatch's one per
    completion."""
    assert estimator not in estimator_names()
    with pytest.raises(ValueError, match="one advantage per TOKEN"):
        get_objective("grpo", advantage_estimator=estimator)
    with pytest.raises(ValueError, match="one advantage per TOKEN"):
        group_advantages(torch.zeros(2, 3), estimator)
    with pytest.raises(ValueError, match="already registered"):
        register_advantage(estimator, lambda rewards: rewards, description="x")


def test_bench_list_names_them(capsys):
    assert main(["list"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("per-token advantage estimators")]
    assert len(line) == 1 and all(e in line[0] for e in TOKEN_ESTIMATORS)
