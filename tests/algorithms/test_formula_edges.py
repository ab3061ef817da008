"""Hand-computed cases for the details the other formula tests leave open: a constant or bound that the default
configuration hides (dual-clip c, GMPO's two bounds), options combined (GMPO or the KL term with rollout correction,
the off-policy mask with the sampler's log-probs), TEPO's KL estimator, one completion per prompt, and the defaults
that come from a paper or a reference implementation.

Same 2 x 3 tensors as test_formulas.py; expected values in plain Python arithmetic from docs/objectives.md.
"""

from __future__ import annotations

import math

import pytest
import torch

from algorithms import default_config, get_objective, group_advantages

from .test_formulas import ADV, DELTA, LP, MASK, OLD, REF, batch, clip_term, k3, tokens

N_TOK = 5
BIG = [[1.5, -0.1, 0.0], [1.5, 0.05, 0.0]]  # token (·, 0): r = e^1.5 = 4.48
OLD_BIG = [[LP[i][t] - BIG[i][t] for t in range(3)] for i in range(2)]


def grad(loss, b):
    (g,) = torch.autograd.grad(loss, b.logprobs)
    return g


def seq_mean(values: dict) -> float:
    return sum(sum(values[(i, t)] for t in range(3) if MASK[i][t]) / sum(MASK[i]) for i in range(2)) / 2


# ------------------------------------------------------------------ rollout correction: the sum is clamped
def test_sequence_correction_clamps_the_sum_not_each_token():
    """One token at old − sampler = 25 and its neighbours at −24 in all: the sequence weight is e^1 (capped at C),
    not e^(20 − 24) = e^−4 (each token clamped first), and a mask keeps the sequence instead of dropping it."""
    s = [[25.0, -14.0, -10.0], [0.1, -0.1, 0.0]]
    sampler = [[OLD[i][t] - s[i][t] for t in range(3)] for i in range(2)]
    pg = {(i, t): clip_term(math.exp(DELTA[i][t]), ADV[i], 0.2, 0.2) for i, t in tokens()}
    w_seq = [math.exp(1.0), math.exp(0.0)]
    for mode, cap, w0 in [("sequence-truncate", 2.0, 2.0), ("sequence-truncate", 5.0, math.e),
                          ("sequence-mask", 5.0, math.e)]:
        loss, m = get_objective("bnpo", rollout_correction=mode, rollout_correction_cap=cap).loss(
            batch(sampler_logprobs=sampler))
        w = {(i, t): (w0 if i == 0 else w_seq[1]) for i, t in tokens()}
        assert loss.item() == pytest.approx(sum(w[k] * pg[k] for k in pg) / N_TOK, abs=1e-12), mode
        assert m["objective/is_weight_max"].item() == pytest.approx(math.e, abs=1e-9)


def test_token_correction_still_clamps_each_token():
    s = [[25.0, -14.0, -10.0], [0.1, -0.1, 0.0]]
    sampler = [[OLD[i][t] - s[i][t] for t in range(3)] for i in range(2)]
    _, m = get_objective("bnpo", rollout_correction="token-truncate", rollout_correction_cap=2.0).loss(
        batch(sampler_logprobs=sampler))
    assert m["objective/is_weight_max"].item() == pytest.approx(math.exp(20.0), rel=1e-9)


# ------------------------------------------------------------------ constants the defaults hide
@pytest.mark.parametrize("c,expected", [(2.0, 2.0), (5.0, math.exp(1.5)), (10.0, math.exp(1.5))])
def test_dual_clip_uses_the_configured_constant(c, expected):
    """Token (1, 0): Â = −1, r = e^1.5 = 4.48: the loss −r·Â is capped at −c·Â = c only when c < 4.48."""
    b = batch(old=OLD_BIG)
    loss, m = get_objective("ppo_dual_clip", dual_clip_c=c).loss(b)
    term = {(i, t): clip_term(math.exp(BIG[i][t]), ADV[i], 0.2, 0.2) for i, t in tokens()}
    term[(1, 0)] = min(term[(1, 0)], c)
    assert loss.item() == pytest.approx(sum(term.values()) / N_TOK, abs=1e-12)
    assert (grad(loss, b)[1, 0].item() == 0.0) == (c < math.exp(1.5))
    assert m["objective/dual_clip_frac"].item() == pytest.approx(0.2 if c < math.exp(1.5) else 0.0)


def test_gmpo_bounds_are_not_interchangeable():
    """ε_low = 0.35, ε_high = 0.2. Seq 0 (Â > 0): log r = [0.3, −0.1, 0] -> min(log r, clip) = [0.2, −0.1, 0].
    Seq 1 (Â < 0): log r = [−0.4, 0.05] -> max(log r, clip) = [−0.35, 0.05]."""
    b = batch()
    loss, m = get_objective("gmpo", clip_low=0.35, clip_high=0.2).loss(b)
    rho0, rho1 = math.exp((0.2 - 0.1 + 0.0) / 3), math.exp((-0.35 + 0.05) / 2)
    assert loss.item() == pytest.approx((-rho0 + rho1) / 2, abs=1e-12)
    expected = [[0.0, -rho0 / 3 / 2, -rho0 / 3 / 2], [0.0, rho1 / 2 / 2, 0.0]]
    torch.testing.assert_close(grad(loss, b), torch.tensor(expected, dtype=torch.float64))
    swapped, _ = get_objective("gmpo", clip_low=0.2, clip_high=0.35).loss(batch())
    assert swapped.item() != pytest.approx(loss.item(), abs=1e-6)


S = [[0.5, -0.1, 0.0], [-1.5, 0.2, 7.0]]  # old − sampler (the pad entry must not matter)
SAMPLER = [[OLD[i][t] - S[i][t] for t in range(3)] for i in range(2)]


@pytest.mark.parametrize("mode", ["token-truncate", "sequence-truncate"])
def test_gmpo_with_rollout_correction(mode):
    """GMPO folds the correction into its sequence term: × the geometric mean of the token weights (token modes)
    or × the sequence weight (sequence modes), once."""
    C = 1.4
    b = batch(sampler_logprobs=SAMPLER)
    loss, _ = get_objective("gmpo", rollout_correction=mode, rollout_correction_cap=C).loss(b)
    log_clip = {0: [min(x, max(min(x, 0.4), -0.4)) for x in DELTA[0]],  # Â > 0: min(log r, clip)
                1: [max(x, max(min(x, 0.4), -0.4)) for x in DELTA[1][:2]]}  # Â < 0: max(log r, clip)
    rho = [math.exp(sum(log_clip[i]) / len(log_clip[i])) for i in range(2)]
    if mode == "token-truncate":
        fold = [math.exp(sum(math.log(min(math.exp(S[i][t]), C)) for t in range(3) if MASK[i][t]) / sum(MASK[i]))
                for i in range(2)]
    else:
        fold = [min(math.exp(sum(S[i][t] for t in range(3) if MASK[i][t])), C) for i in range(2)]
    expected = sum(-ADV[i] * rho[i] * fold[i] for i in range(2)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-9)


def test_rollout_correction_weights_the_policy_term_only_not_the_kl():
    C = 1.4
    b = batch(sampler_logprobs=SAMPLER)
    loss, m = get_objective("grpo", rollout_correction="token-truncate", rollout_correction_cap=C).loss(b)
    w = {(i, t): min(math.exp(S[i][t]), C) for i, t in tokens()}
    ell = {(i, t): w[(i, t)] * clip_term(math.exp(DELTA[i][t]), ADV[i], 0.2, 0.2) + 0.04 * k3(LP[i][t], REF[i][t])
           for i, t in tokens()}
    assert loss.item() == pytest.approx(seq_mean(ell), abs=1e-12)
    assert m["objective/kl_term"].item() == pytest.approx(
        seq_mean({k: 0.04 * k3(LP[k[0]][k[1]], REF[k[0]][k[1]]) for k in tokens()}), abs=1e-12)


def test_off_policy_mask_reads_the_sampler_log_probs():
    """δ = 0.1. Against the trainer's old log-probs seq 1 drifted by mean_t (old − lp) = 0.175 (dropped); with the
    sampler's log-probs given, the drift is mean_t (s − lp): made 0 here, so seq 1 stays — and the other way round."""
    close = [[LP[i][t] for t in range(3)] for i in range(2)]  # s = lp: no drift
    kept_both = sum(clip_term(math.exp(DELTA[i][t]), ADV[i], 0.2, 0.28) for i, t in tokens()) / N_TOK
    loss, m = get_objective("dapo", off_policy_mask_threshold=0.1).loss(batch(sampler_logprobs=close))
    assert loss.item() == pytest.approx(kept_both, abs=1e-12)
    assert m["objective/off_policy_masked_frac"].item() == 0.0
    far = [[LP[i][t] + 0.5 for t in range(3)] for i in range(2)]  # mean_t (s − lp) = 0.5 > δ
    loss2, m2 = get_objective("dapo", off_policy_mask_threshold=0.3).loss(batch(old=LP, sampler_logprobs=far))
    # old = lp: the trainer sees no drift; the sampler does, so seq 1 (Â < 0) is dropped (the normaliser keeps it)
    kept0 = sum(clip_term(1.0, 1.0, 0.2, 0.28) for _ in range(3)) / N_TOK
    assert loss2.item() == pytest.approx(kept0, abs=1e-12)
    assert m2["objective/off_policy_masked_frac"].item() == pytest.approx(0.5)


# ------------------------------------------------------------------ TEPO's KL estimator
@pytest.mark.parametrize("estimator,kl", [("k1", lambda lp, ref: lp - ref),
                                          ("k2", lambda lp, ref: 0.5 * (lp - ref) ** 2),
                                          ("k3", k3)])
def test_tepo_masked_kl_uses_the_configured_estimator(estimator, kl):
    """M ≡ 1 (kl_mask=all): loss(estimator) − loss(no KL) = β · Σ_t KL_t / N (token-mean); the gradient too."""
    b, b0 = batch(), batch()
    loss, _ = get_objective("tepo", kl_mask="all", kl_estimator=estimator).loss(b)
    base, _ = get_objective("tepo", kl_coef=0.0).loss(b0)
    assert loss.item() - base.item() == pytest.approx(
        0.04 * sum(kl(LP[i][t], REF[i][t]) for i, t in tokens()) / N_TOK, abs=1e-12)
    dkl = {"k1": lambda lp, ref: 1.0, "k2": lambda lp, ref: lp - ref,
           "k3": lambda lp, ref: 1.0 - math.exp(ref - lp)}[estimator]
    diff = grad(loss, b) - grad(base, b0)
    for i, t in tokens():
        assert diff[i, t].item() == pytest.approx(0.04 * dkl(LP[i][t], REF[i][t]) / N_TOK, abs=1e-12)


# ------------------------------------------------------------------ one completion per prompt
R1 = torch.tensor([[1.0], [0.0], [1.0]], dtype=torch.float64)
L1 = torch.tensor([[2], [3], [1]])


def test_rloo_with_one_completion_has_no_baseline():
    """No other completion to leave out: the advantage is the reward itself (verl's rloo for a group of one)."""
    torch.testing.assert_close(group_advantages(R1, "rloo"), R1)


def test_reinforce_pp_baseline_with_one_completion_whitens_the_rewards():
    """Group of one: no group mean is subtracted (it would zero every advantage); the batch whitening is weighted
    by the lengths 2, 3, 1: mean 0.5, variance 0.25 · 6/5 = 0.3 (Bessel), Â = (R − 0.5)/sqrt(0.3 + 1e-8)."""
    expected = torch.tensor([[0.5], [-0.5], [0.5]], dtype=torch.float64) / math.sqrt(0.3 + 1e-8)
    torch.testing.assert_close(group_advantages(R1, "reinforce++-baseline", lengths=L1), expected)


# ------------------------------------------------------------------ defaults taken from a source
def test_cispo_default_caps_the_weight_at_five():
    """ε_max = 5 of ScaleRL (arXiv 2510.13786) and TRL's recommended `epsilon_high` for CISPO: with r = e^2 = 7.39
    the detached weight is 5, so ∂loss/∂lp = −5·Â / N on that token; no lower bound (ε_low = 1)."""
    lp = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -9.0]]
    old = [[lp[0][0] - 2.0, lp[0][1] + 3.0, lp[0][2]], [lp[1][0], lp[1][1], lp[1][2]]]
    b = batch(lp=lp, old=old)
    loss, _ = get_objective("cispo").loss(b)
    g = grad(loss, b)
    assert g[0, 0].item() == pytest.approx(-5.0 * ADV[0] / N_TOK, abs=1e-12)
    assert g[0, 1].item() == pytest.approx(-math.exp(-3.0) * ADV[0] / N_TOK, abs=1e-12)  # r = e^−3 kept as it is


def test_gpg_defaults_to_its_own_estimator():
    """GPG's advantage α (R − mean_g R), α = N / #{R ≠ 0} (arXiv 2504.02546): rewards [[1, 0], [0, 0]] -> α = 4."""
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    adv = get_objective("gpg").advantages(rewards)
    torch.testing.assert_close(adv, torch.tensor([[2.0, -2.0], [0.0, 0.0]], dtype=torch.float64))


def test_rloo_default_has_no_kl_term():
    """RLOO as registered (arXiv 2402.14740's estimator on the GRPO surrogate, as verl's `rloo` with its default
    use_kl_loss = False): β = 0, so no reference pass; the loss does not change with the reference log-probs."""
    assert default_config("rloo").kl_coef == 0.0
    obj = get_objective("rloo")
    assert not obj.needs_reference
    a, _ = obj.loss(batch())
    b, _ = obj.loss(batch(ref=[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert a.item() == b.item()
