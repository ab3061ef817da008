"""Hand-computed 2 x 3 cases for the objectives, options and batch corrections that come from TRL and verl (values
and gradients).

Same tensors as test_formulas.py (sequence 0: 3 tokens, Â = +1; sequence 1: 2 tokens + 1 pad, Â = −1); expected
values in plain Python arithmetic from the formulas of docs/objectives.md.
"""

from __future__ import annotations

import math

import pytest
import torch

from algorithms import PolicyBatch, get_objective

from .test_formulas import ADV, DELTA, L_MAX, LP, MASK, OLD, REF, batch, clip_term, k3, tokens

N_TOK = 5


def grad(loss, b):
    (g,) = torch.autograd.grad(loss, b.logprobs)
    return g


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def seq_mean(values: dict) -> float:
    """seq-mean-token-mean of a {(i, t): value} dict over the completion tokens."""
    return sum(sum(values[(i, t)] for t in range(3) if MASK[i][t]) / sum(MASK[i]) for i in range(2)) / 2


def test_cispo_weight_is_clipped_and_detached():
    b = batch()
    loss, m = get_objective("cispo", clip_high=0.2).loss(b)
    w = {(i, t): min(math.exp(DELTA[i][t]), 1.2) for i, t in tokens()}  # token (0,0): e^0.3 -> 1.2
    expected = sum(-w[k] * ADV[k[0]] * LP[k[0]][k[1]] for k in w) / N_TOK
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    g = grad(loss, b)
    for (i, t), wi in w.items():  # ∂/∂lp = −w·Â / N: the clipped token keeps its gradient (unlike PPO's clip)
        assert g[i, t].item() == pytest.approx(-wi * ADV[i] / N_TOK, abs=1e-12)
    assert m["objective/clip_frac_high"].item() == pytest.approx(1 / 5)


def test_sapo_soft_gate_value_and_gradient():
    b = batch()
    loss, _ = get_objective("sapo").loss(b)
    tau = {0: 1.0, 1: 1.05}  # Â > 0 -> τ_pos, else τ_neg
    term = {(i, t): -4 / tau[i] * sigmoid(tau[i] * (math.exp(DELTA[i][t]) - 1)) * ADV[i] for i, t in tokens()}
    assert loss.item() == pytest.approx(seq_mean(term), abs=1e-12)
    g = grad(loss, b)
    for i, t in tokens():
        r, s = math.exp(DELTA[i][t]), sigmoid(tau[i] * (math.exp(DELTA[i][t]) - 1))
        assert g[i, t].item() == pytest.approx(-4 * s * (1 - s) * r * ADV[i] / (2 * sum(MASK[i])), abs=1e-12)


def test_sapo_gradient_at_ratio_one_is_the_policy_gradient():
    b = batch(old=LP)
    loss, _ = get_objective("sapo").loss(b)
    g = grad(loss, b)
    for i, t in tokens():
        assert g[i, t].item() == pytest.approx(-ADV[i] / (2 * sum(MASK[i])), abs=1e-12)


def test_gmpo_geometric_mean_of_log_clipped_ratios():
    b = batch()
    loss, m = get_objective("gmpo", clip_low=0.2, clip_high=0.2).loss(b)
    # seq 0 (Â>0): log r = [0.3, −0.1, 0] -> min(log r, clip) = [0.2, −0.1, 0]
    # seq 1 (Â<0): log r = [−0.4, 0.05] -> max(log r, clip) = [−0.2, 0.05]
    rho0, rho1 = math.exp((0.2 - 0.1 + 0.0) / 3), math.exp((-0.2 + 0.05) / 2)
    assert loss.item() == pytest.approx((-rho0 * 1 + rho1 * 1) / 2, abs=1e-12)
    g = grad(loss, b)
    expected = [[0.0, -rho0 / 3 / 2, -rho0 / 3 / 2], [0.0, rho1 / 2 / 2, 0.0]]  # clipped tokens: no gradient
    torch.testing.assert_close(g, torch.tensor(expected, dtype=torch.float64))
    assert m["objective/clip_frac_high"].item() == pytest.approx(1 / 5)
    assert m["objective/clip_frac_low"].item() == pytest.approx(1 / 5)


def test_gpg_plain_policy_gradient():
    b = batch()
    loss, _ = get_objective("gpg").loss(b)
    assert loss.item() == pytest.approx(sum(-ADV[i] * LP[i][t] for i, t in tokens()) / N_TOK, abs=1e-12)
    g = grad(loss, b)
    for i, t in tokens():
        assert g[i, t].item() == pytest.approx(-ADV[i] / N_TOK, abs=1e-12)


def test_vespo_gamma_weight_of_the_sequence_ratio():
    b = batch()
    loss, _ = get_objective("vespo").loss(b)
    phi = {}
    for i, (k, lam) in enumerate([(2.0, 3.0), (3.0, 2.0)]):  # Â ≥ 0: (k_pos, λ_pos); Â < 0: (k_neg, λ_neg)
        w = math.exp(sum(DELTA[i][t] for t in range(3) if MASK[i][t]))
        phi[i] = math.exp(lam) * w ** k * math.exp(-lam * w)
    assert loss.item() == pytest.approx(sum(-phi[i] * ADV[i] * LP[i][t] for i, t in tokens()) / N_TOK, abs=1e-12)
    g = grad(loss, b)
    for i, t in tokens():
        assert g[i, t].item() == pytest.approx(-phi[i] * ADV[i] / N_TOK, abs=1e-12)


BIG = [[1.5, -0.1, 0.0], [1.5, 0.05, 0.0]]  # token (·,0): r = e^1.5 = 4.48
OLD_BIG = [[LP[i][t] - BIG[i][t] for t in range(3)] for i in range(2)]


def test_dual_clip_caps_negative_advantage_loss():
    b = batch(old=OLD_BIG)
    loss, m = get_objective("ppo_dual_clip").loss(b)
    term = {(i, t): clip_term(math.exp(BIG[i][t]), ADV[i], 0.2, 0.2) for i, t in tokens()}
    assert term[(1, 0)] == pytest.approx(math.exp(1.5))  # −r·Â with Â = −1: unbounded without dual clip
    term[(1, 0)] = 3.0  # min(term, −c·Â), c = 3
    assert loss.item() == pytest.approx(sum(term.values()) / N_TOK, abs=1e-12)
    g = grad(loss, b)
    assert g[1, 0].item() == 0.0 and g[1, 1].item() != 0.0
    assert m["objective/dual_clip_frac"].item() == pytest.approx(1 / 5)


def test_two_sided_clip_delta():
    b = batch(old=OLD_BIG)
    loss, _ = get_objective("dapo", clip_delta=2.0).loss(b)
    term = {(i, t): -min(min(math.exp(BIG[i][t]), 2.0) * ADV[i],
                         min(max(math.exp(BIG[i][t]), 0.8), 1.28) * ADV[i]) for i, t in tokens()}
    assert term[(1, 0)] == pytest.approx(2.0)
    assert loss.item() == pytest.approx(sum(term.values()) / N_TOK, abs=1e-12)
    assert grad(loss, b)[1, 0].item() == 0.0


def test_sequence_level_ratio_for_the_clipped_surrogate():
    b = batch()
    loss, _ = get_objective("grpo", ratio_level="sequence", kl_coef=0.0).loss(b)
    rho = [math.exp(sum(DELTA[i][t] for t in range(3) if MASK[i][t]) / sum(MASK[i])) for i in range(2)]
    term = {(i, t): clip_term(rho[i], ADV[i], 0.2, 0.2) for i, t in tokens()}
    assert loss.item() == pytest.approx(seq_mean(term), abs=1e-12)
    g = grad(loss, b)  # ρ0 = e^{0.2/3} inside the clip: ∂/∂lp_0t = −Â ρ0 / 3 (seq-mean over 3 tokens) / 3 / 2
    assert g[0, 1].item() == pytest.approx(-rho[0] / 3 / 2, abs=1e-12)


def test_bias_corrected_kl_is_ratio_times_k3():
    b = batch()
    loss, _ = get_objective("grpo", kl_is_correction=True).loss(b)
    pg = {(i, t): clip_term(math.exp(DELTA[i][t]), ADV[i], 0.2, 0.2) for i, t in tokens()}
    ell = {(i, t): pg[(i, t)] + 0.04 * math.exp(DELTA[i][t]) * k3(LP[i][t], REF[i][t]) for i, t in tokens()}
    assert loss.item() == pytest.approx(seq_mean(ell), abs=1e-12)
    # token (0,1) unclipped: ∂/∂lp [−r Â + β r k3] = −rÂ + β r (k3 + 1 − e^{ref−lp})
    r, d = math.exp(DELTA[0][1]), REF[0][1] - LP[0][1]
    dk = r * k3(LP[0][1], REF[0][1]) + r * (1 - math.exp(d))
    assert grad(loss, b)[0, 1].item() == pytest.approx((-r + 0.04 * dk) / 3 / 2, abs=1e-12)


def test_luspo_sums_tokens_then_averages_sequences():
    b = batch()
    loss, _ = get_objective("luspo").loss(b)
    rho = [math.exp(sum(DELTA[i][t] for t in range(3) if MASK[i][t]) / sum(MASK[i])) for i in range(2)]
    term = {(i, t): clip_term(rho[i], ADV[i], 3e-4, 4e-4) for i, t in tokens()}
    assert loss.item() == pytest.approx(sum(term.values()) / 2, abs=1e-12)


def test_bnpo_is_token_mean():
    loss, _ = get_objective("bnpo").loss(batch())
    assert loss.item() == pytest.approx(sum(per for per in (clip_term(math.exp(DELTA[i][t]), ADV[i], 0.2, 0.2)
                                                            for i, t in tokens())) / N_TOK, abs=1e-12)


def test_off_policy_sequence_mask_drops_negative_advantage_drifted_sequences():
    b = batch()
    # mean_t (old − lp): seq 0 = −0.2/3 (kept anyway, Â > 0), seq 1 = (0.4 − 0.05)/2 = 0.175 > δ = 0.1 -> dropped
    loss, m = get_objective("dapo", off_policy_mask_threshold=0.1).loss(b)
    kept = sum(clip_term(math.exp(DELTA[0][t]), 1.0, 0.2, 0.28) for t in range(3))
    assert loss.item() == pytest.approx(kept / N_TOK, abs=1e-12)  # the normaliser still counts seq 1's tokens
    assert m["objective/off_policy_masked_frac"].item() == pytest.approx(0.5)
    loss2, _ = get_objective("dapo", off_policy_mask_threshold=0.2).loss(batch())
    assert loss2.item() != pytest.approx(loss.item())


def test_truncated_completions_leave_the_loss():
    b = batch(truncated=[False, True])
    loss, m = get_objective("dapo", mask_truncated=True).loss(b)
    kept = sum(clip_term(math.exp(DELTA[0][t]), 1.0, 0.2, 0.28) for t in range(3))
    assert loss.item() == pytest.approx(kept / 3, abs=1e-12)  # token-mean over the 3 tokens that remain
    assert torch.all(grad(loss, b)[1] == 0)
    assert m["objective/truncated_masked_frac"].item() == 0.5
    with pytest.raises(ValueError, match="truncated"):
        get_objective("dapo", mask_truncated=True).loss(batch())


S = [[0.5, -0.1, 0.0], [-1.5, 0.2, 7.0]]  # synthetic mismatch old − sampler (pad entry must not matter)
SAMPLER = [[OLD[i][t] - S[i][t] for t in range(3)] for i in range(2)]


@pytest.mark.parametrize("mode", ["token-truncate", "token-mask", "sequence-truncate", "sequence-mask"])
def test_rollout_correction_weights_on_a_synthetic_mismatch(mode):
    C = 1.4
    b = batch(sampler_logprobs=SAMPLER)
    loss, m = get_objective("bnpo", rollout_correction=mode, rollout_correction_cap=C).loss(b)
    if mode.startswith("token"):
        raw = {(i, t): math.exp(S[i][t]) for i, t in tokens()}
    else:
        seq = [math.exp(sum(S[i][t] for t in range(3) if MASK[i][t])) for i in range(2)]
        raw = {(i, t): seq[i] for i, t in tokens()}
    if mode.endswith("truncate"):
        w = {k: min(v, C) for k, v in raw.items()}
    else:
        w = {k: v if 1 / C <= v <= C else 0.0 for k, v in raw.items()}
    pg = {(i, t): clip_term(math.exp(DELTA[i][t]), ADV[i], 0.2, 0.2) for i, t in tokens()}
    assert loss.item() == pytest.approx(sum(w[k] * pg[k] for k in pg) / N_TOK, abs=1e-12)
    d = {(i, t): S[i][t] for i, t in tokens()}  # log(π_old/π_sampler)
    assert m["objective/mismatch_kl_k3"].item() == pytest.approx(
        sum(math.exp(v) - v - 1 for v in d.values()) / N_TOK, abs=1e-12)
    assert m["objective/mismatch_kl_k1"].item() == pytest.approx(-sum(d.values()) / N_TOK, abs=1e-12)
    assert m["objective/is_weight_max"].item() == pytest.approx(max(raw.values()), abs=1e-12)
    assert m["objective/is_cut_frac"].item() > 0


def test_rollout_correction_is_identity_without_mismatch():
    base, _ = get_objective("grpo").loss(batch())
    for mode in ("token-truncate", "sequence-mask"):
        loss, m = get_objective("grpo", rollout_correction=mode).loss(batch(sampler_logprobs=OLD))
        assert loss.item() == pytest.approx(base.item(), abs=1e-12)
        assert m["objective/is_weight_mean"].item() == pytest.approx(1.0)
        assert m["objective/mismatch_kl_k3"].item() == pytest.approx(0.0)


def test_rollout_correction_needs_sampler_logprobs():
    obj = get_objective("grpo", rollout_correction="token-mask")
    assert obj.needs_sampler_logprobs
    with pytest.raises(ValueError, match="sampler_logprobs"):
        obj.loss(batch())


def test_objectives_without_batch_options_refuse_them():
    with pytest.raises(ValueError, match="rollout_correction"):
        get_objective("tepo", rollout_correction="token-truncate")


# --- TOPR (arXiv 2503.14286): −sg[w_i]·Â·lp, w_i = 1 for Â ≥ 0, clip(π_θ(y_i)/π_old(y_i), 0, 1) for Â < 0;
# seq-mean-token-sum (Σ_t over each sequence, mean over the B = 2 sequences)
def topr_expected(delta, adv=ADV, mean=False):
    w = {}
    for i in range(2):
        s = [delta[i][t] for t in range(3) if MASK[i][t]]
        log_r = sum(s) / len(s) if mean else sum(s)
        w[i] = 1.0 if adv[i] >= 0 else min(max(math.exp(log_r), 0.0), 1.0)
    value = sum(-w[i] * adv[i] * LP[i][t] for i, t in tokens()) / 2
    grads = {(i, t): -w[i] * adv[i] / 2 for i, t in tokens()}
    return w, value, grads


def test_topr_negative_sequence_gets_its_detached_sequence_ratio():
    b = batch()
    loss, m = get_objective("topr").loss(b)
    w, value, grads = topr_expected(DELTA)
    assert w[1] == pytest.approx(math.exp(-0.35))  # seq 1: Σ_t (lp − old) = −0.4 + 0.05, product of token ratios
    assert loss.item() == pytest.approx(value, abs=1e-12)  # (3.5 − e^−0.35·1.5) / 2
    g = grad(loss, b)
    for i, t in tokens():  # detached weight: ∂/∂lp = −w·Â / B, no term from ∂w/∂lp
        assert g[i, t].item() == pytest.approx(grads[(i, t)], abs=1e-12)
    assert g[1, 2].item() == 0.0  # padding
    assert m["objective/taper_frac"].item() == 0.0


def test_topr_truncates_only_negatives_and_only_from_above():
    # seq 0 (Â > 0) has ratio e^−0.4 < 1: it still gets weight 1 (no importance weight on positives);
    # seq 1 (Â < 0) has ratio e^0.45 > 1: truncated to 1
    delta = [[-0.3, -0.1, 0.0], [0.4, 0.05, 0.0]]
    old = [[LP[i][t] - delta[i][t] for t in range(3)] for i in range(2)]
    b = batch(old=old)
    loss, m = get_objective("topr").loss(b)
    w, value, grads = topr_expected(delta)
    assert w == {0: 1.0, 1: 1.0}
    assert loss.item() == pytest.approx(value, abs=1e-12)
    g = grad(loss, b)
    for i, t in tokens():
        assert g[i, t].item() == pytest.approx(grads[(i, t)], abs=1e-12)
    assert m["objective/taper_frac"].item() == pytest.approx(2 / 5)


def test_topr_far_off_policy_stays_finite_and_bounded():
    delta = [[-60.0, 0.0, 0.0], [60.0, 0.0, 0.0]]  # ratios e^∓60: overflow if exponentiated before the truncation
    old = [[LP[i][t] - delta[i][t] for t in range(3)] for i in range(2)]
    b = batch(old=old)
    loss, _ = get_objective("topr").loss(b)
    g = grad(loss, b)
    expected = [[-0.5, -0.5, -0.5], [0.5, 0.5, 0.0]]
    torch.testing.assert_close(g, torch.tensor(expected, dtype=torch.float64))


def test_topr_length_normalised_ratio_option():
    b = batch()
    loss, _ = get_objective("topr", taper_ratio="sequence-mean").loss(b)
    w, value, _ = topr_expected(DELTA, mean=True)
    assert w[1] == pytest.approx(math.exp(-0.35 / 2))
    assert loss.item() == pytest.approx(value, abs=1e-12)


def test_topr_single_negative_sequence():
    # a batch of one completion (a group of one): Â = −1, ratio e^−0.35 -> loss = w·Σ_t lp (divided by B = 1)
    b = PolicyBatch(logprobs=torch.tensor([LP[1]], dtype=torch.float64, requires_grad=True),
                    old_logprobs=torch.tensor([OLD[1]], dtype=torch.float64),
                    advantages=torch.tensor([-1.0], dtype=torch.float64),
                    mask=torch.tensor([MASK[1]], dtype=torch.float64), max_length=L_MAX)
    loss, _ = get_objective("topr").loss(b)
    w = math.exp(-0.35)
    assert loss.item() == pytest.approx(w * (LP[1][0] + LP[1][1]), abs=1e-12)
    torch.testing.assert_close(grad(loss, b), torch.tensor([[w, w, 0.0]], dtype=torch.float64))


def test_topr_refuses_a_sequence_ratio_level():
    with pytest.raises(ValueError, match="ratio_level"):
        get_objective("topr", ratio_level="sequence")


# --- DPPO (verl dppo_tv / dppo_kl) and DRO (verl dro). Own old log-probs (valid: all < 0) so that the binary
# divergences are defined; sequence 0 (Â = +1) and sequence 1 (Â = −1) each hold one token that moved a lot AGAINST
# the direction its advantage pushes (0,2) and (1,1): the trust region must keep those.
DPPO_OLD = [[-1.3, -1.9, -0.1], [-0.1, -2.0, -9.0]]
DPPO_DELTA = [[LP[i][t] - DPPO_OLD[i][t] for t in range(3)] for i in range(2)]  # [[.3, −.1, −.4], [−.2, .8, 0]]


def binary_tv_out(p: float, p_old: float, a: float, lo: float, hi: float) -> bool:
    """Out of DPPO's binary-TV trust region: the probability moved beyond δ the way Â pushes it."""
    return p - p_old > hi if a > 0 else p - p_old < -lo


def binary_kl_out(p: float, p_old: float, a: float, lo: float, hi: float) -> bool:
    kl = p_old * math.log(p_old / p) + (1 - p_old) * math.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
    return (kl > hi and p > p_old) if a > 0 else (kl > lo and p < p_old)


def dppo_expected(out_fn, lo: float, hi: float, cap: float):
    """(out tokens, value, gradients) of −sg[1[in]·min(r, C)]·Â·lp, token-mean over the 5 completion tokens."""
    out, value, grads = set(), 0.0, {}
    for i, t in tokens():
        p, p_old = math.exp(LP[i][t]), math.exp(DPPO_OLD[i][t])
        w = 0.0 if out_fn(p, p_old, ADV[i], lo, hi) else min(math.exp(DPPO_DELTA[i][t]), cap)
        if w == 0.0:
            out.add((i, t))
        value += -w * ADV[i] * LP[i][t] / N_TOK
        grads[(i, t)] = -w * ADV[i] / N_TOK  # the weight is detached: no ∂w/∂lp term
    return out, value, grads


def check_dppo(name: str, out_fn, expected_out: set, lo: float, hi: float, cap: float, **overrides):
    b = batch(old=DPPO_OLD)
    loss, m = get_objective(name, **overrides).loss(b)
    out, value, grads = dppo_expected(out_fn, lo, hi, cap)
    assert out == expected_out  # the hand arithmetic agrees with the case described in the test
    assert loss.item() == pytest.approx(value, abs=1e-12)
    g = grad(loss, b)
    for (i, t), gi in grads.items():
        assert g[i, t].item() == pytest.approx(gi, abs=1e-12)
    assert g[1, 2].item() == 0.0  # padding
    return m


def test_dppo_tv_drops_tokens_that_left_the_region_in_their_advantage_direction():
    # δ = 0.05: (0,0) Â > 0, π rose by e^−1 − e^−1.3 = 0.095 -> out; (1,0) Â < 0, π fell by 0.164 -> out;
    # (0,2) Â > 0 but π FELL by 0.30 and (1,1) Â < 0 but π ROSE by 0.17: both stay (the region is one-sided)
    m = check_dppo("dppo_tv", binary_tv_out, {(0, 0), (1, 0)}, 0.05, 0.05, 20.0, delta_low=0.05, delta_high=0.05)
    assert m["objective/clip_frac_high"].item() == pytest.approx(1 / 5)
    assert m["objective/clip_frac_low"].item() == pytest.approx(1 / 5)


def test_dppo_tv_truncates_the_detached_ratio_at_the_cap():
    # default δ = 0.2 keeps every token; C = 1.2 truncates (0,0) (e^0.3) and (1,1) (e^0.8)
    m = check_dppo("dppo_tv", binary_tv_out, set(), 0.2, 0.2, 1.2, ratio_cap=1.2)
    assert m["objective/ratio_truncated_frac"].item() == pytest.approx(2 / 5)
    assert m["objective/clip_frac_low"].item() == 0.0


def test_dppo_kl_uses_the_binary_kl_not_the_tv():
    # default δ = 0.05: (0,0) has binary KL 0.0205 (kept, where the TV at 0.05 drops it), (1,0) 0.086 (out);
    # (0,2) KL 0.23 and (1,1) KL 0.076 exceed δ but moved against their advantage: kept
    check_dppo("dppo_kl", binary_kl_out, {(1, 0)}, 0.05, 0.05, 20.0)


def test_dppo_refuses_a_sequence_ratio_level_and_a_cap_of_one():
    with pytest.raises(ValueError, match="ratio_level"):
        get_objective("dppo_tv", ratio_level="sequence")
    with pytest.raises(ValueError, match="ratio_cap"):
        get_objective("dppo_kl", ratio_cap=1.0)


def test_dro_value_and_gradient():
    b = batch()
    beta = 0.05
    loss, _ = get_objective("dro").loss(b)
    value = sum(-(ADV[i] * LP[i][t] - 0.5 * beta * DELTA[i][t] ** 2) for i, t in tokens()) / N_TOK
    assert loss.item() == pytest.approx(value, abs=1e-12)
    g = grad(loss, b)
    for i, t in tokens():  # ∂/∂lp = −(Â − β(lp − old)) / N: the penalty pulls lp back to old
        assert g[i, t].item() == pytest.approx(-(ADV[i] - beta * DELTA[i][t]) / N_TOK, abs=1e-12)


def test_dro_penalty_reaches_a_zero_advantage_sequence():
    # a group of one completion has Â = 0: its tokens still get β(lp − old)/N from the penalty (not skippable)
    b = batch(adv=[0.0, -1.0])
    loss, _ = get_objective("dro", beta=0.2).loss(b)
    g = grad(loss, b)
    for t in range(3):
        assert g[0, t].item() == pytest.approx(0.2 * DELTA[0][t] / N_TOK, abs=1e-12)
    assert not get_objective("dro").skips_zero_advantage
    with pytest.raises(ValueError, match="beta"):
        get_objective("dro", beta=0.0)


# ------------------------------------------------------------------ UP-GRPO (arXiv 2607.06987, verl PR #7022)
def up_expected(delta, c: float = 3.0) -> dict:
    """Per-token terms: −Â for Â > 0 (the self-anchored ratio is 1 in value), the clipped surrogate capped at −c·Â
    for Â ≤ 0."""
    out = {}
    for i, t in tokens():
        if ADV[i] > 0:
            out[(i, t)] = -ADV[i]
        else:
            out[(i, t)] = min(clip_term(math.exp(delta[i][t]), ADV[i], 0.2, 0.2), -c * ADV[i]) if c else \
                clip_term(math.exp(delta[i][t]), ADV[i], 0.2, 0.2)
    return out


def test_up_grpo_positive_tokens_get_the_unanchored_reinforce_gradient():
    """On-policy-far ratios (e^1.5 on the first token of each sequence): the positive sequence's tokens keep value −Â
    and gradient −Â·∇lp / N, with no clip (grpo clips that token: zero gradient); the negative one is capped by
    the dual clip."""
    b = batch(old=OLD_BIG)
    obj = get_objective("up_grpo")
    loss, m = obj.loss(b)
    terms = up_expected(BIG)
    assert terms[(1, 0)] == 3.0  # −r·Â = e^1.5 > 3: the dual clip
    n = {i: sum(MASK[i]) for i in range(2)}
    agg = obj.config.aggregation
    value = (sum(terms.values()) / N_TOK if agg == "token-mean" else
             sum(sum(terms[(i, t)] for t in range(3) if MASK[i][t]) / n[i] for i in range(2)) / 2)
    kl = obj.config.kl_coef * (sum(k3(LP[i][t], REF[i][t]) / n[i] for i, t in tokens()) / 2
                               if agg != "token-mean" else sum(k3(LP[i][t], REF[i][t]) for i, t in tokens()) / N_TOK)
    assert loss.item() == pytest.approx(value + kl, abs=1e-12)
    b0 = batch(old=OLD_BIG)
    loss0, _ = get_objective("up_grpo", kl_coef=0.0, aggregation="token-mean").loss(b0)
    g = grad(loss0, b0)
    for t in range(3):  # every token of the positive sequence, the far one included (grpo: clipped, 0)
        assert g[0, t].item() == pytest.approx(-ADV[0] / N_TOK, abs=1e-12)
    assert g[1, 0].item() == 0.0  # dual-clipped
    assert g[1, 1].item() == pytest.approx(-ADV[1] * math.exp(BIG[1][1]) / N_TOK, abs=1e-12)  # inside the clip
    grpo = get_objective("grpo", kl_coef=0.0, aggregation="token-mean")
    b1 = batch(old=OLD_BIG)
    assert grad(grpo.loss(b1)[0], b1)[0, 0].item() == 0.0  # (what UP removes)
    assert m["objective/unbounded_frac"].item() == pytest.approx(3 / 5)
    assert m["objective/clip_frac_high"].item() == 0.0  # a positive token is never clipped (grpo: 1 of 5 here)


def test_up_grpo_without_dual_clip_is_the_clipped_surrogate_on_negatives():
    b = batch(old=OLD_BIG)
    loss, _ = get_objective("up_grpo", dual_clip_c=0.0, kl_coef=0.0, aggregation="token-mean").loss(b)
    terms = up_expected(BIG, c=0.0)
    assert terms[(1, 0)] == pytest.approx(math.exp(1.5))
    assert loss.item() == pytest.approx(sum(terms.values()) / N_TOK, abs=1e-12)


# ------------------------------------------------------------------ CFPO (arXiv 2601.22801, its authors' verl PR #5252)
def cfpo_term(r: float, a: float, eps: float = 0.2) -> float:
    return -(r * a - abs(a) * (r - 1) ** 2 / (2 * eps))


def cfpo_grad(r: float, a: float, eps: float = 0.2) -> float:
    """∂/∂lp of cfpo_term at r = exp(lp − old): −r·(Â − |Â|(r − 1)/ε)."""
    return -r * (a - abs(a) * (r - 1) / eps)


def test_cfpo_value_and_gradient_token_mean():
    b = batch()
    loss, m = get_objective("cfpo", kl_coef=0.0, aggregation="token-mean").loss(b)
    r = {(i, t): math.exp(DELTA[i][t]) for i, t in tokens()}
    assert loss.item() == pytest.approx(sum(cfpo_term(r[k], ADV[k[0]]) for k in r) / N_TOK, abs=1e-12)
    g = grad(loss, b)
    for (i, t), rv in r.items():
        assert g[i, t].item() == pytest.approx(cfpo_grad(rv, ADV[i]) / N_TOK, abs=1e-12)
    assert g[0, 2].item() == pytest.approx(-ADV[0] / N_TOK, abs=1e-12)  # at r = 1 the penalty's slope is 0
    assert g[1, 2].item() == 0.0  # padding
    # past the optimum on the advantage's side: (0, 0) r = e^0.3 > 1.2 with Â > 0, (1, 0) r = e^-0.4 < 0.8 with Â < 0
    assert m["objective/clip_frac_high"].item() == pytest.approx(1 / 5)
    assert m["objective/clip_frac_low"].item() == pytest.approx(1 / 5)


def test_cfpo_defaults_are_grpo_but_for_the_policy_term():
    b = batch()
    loss, _ = get_objective("cfpo").loss(b)
    terms = {(i, t): cfpo_term(math.exp(DELTA[i][t]), ADV[i]) + 0.04 * k3(LP[i][t], REF[i][t]) for i, t in tokens()}
    assert loss.item() == pytest.approx(seq_mean(terms), abs=1e-12)


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_cfpo_optimum_is_the_clip_edge_and_the_penalty_pulls_back_past_it(adv):
    """A token's objective r·Â − |Â|(r − 1)²/(2ε) peaks at r = 1 + sign(Â)·ε: zero gradient there; past it the
    gradient turns (descent moves r back towards it), where GRPO's clip gives exactly 0; inside, the push is the
    unclipped one shrunk by the penalty. An |Â| written as Â, a 1/ε for 1/(2ε), a flipped penalty sign or a detached
    penalty ratio each move or remove this optimum."""
    eps = 0.2
    obj = get_objective("cfpo", kl_coef=0.0, aggregation="token-mean", tv_eps=eps)
    grpo = get_objective("grpo", kl_coef=0.0, aggregation="token-mean")
    edge = 1 + math.copysign(eps, adv)

    def one_token(r: float) -> PolicyBatch:
        return batch(lp=[[-1.0] * 3], old=[[-1.0 - math.log(r)] * 3], ref=[[-1.0] * 3], adv=[adv], mask=[[1, 0, 0]])

    for r, sign in ((edge, 0), (edge + math.copysign(0.1, adv), 1), (1 + math.copysign(0.05, adv), -1)):
        b = one_token(r)
        g = grad(obj.loss(b)[0], b)[0, 0].item()
        assert g == pytest.approx(cfpo_grad(r, adv, eps), abs=1e-12)
        if sign == 0:
            assert g == pytest.approx(0.0, abs=1e-12)
        else:  # sign(∂loss/∂lp)·sign(Â): +1 past the edge (pulled back), −1 inside (pushed towards it)
            assert math.copysign(1, g) * math.copysign(1, adv) == sign
        if sign == 1:
            b1 = one_token(r)
            assert grad(grpo.loss(b1)[0], b1)[0, 0].item() == 0.0  # (the zero-gradient region CFPO removes)


def test_cfpo_group_of_one_and_far_ratios():
    # a group of one completion has Â = 0: no policy gradient, only the KL (grpo's β = 0.04) reaches it
    b = batch(adv=[0.0, 0.0])
    g = grad(get_objective("cfpo", kl_coef=0.0).loss(b)[0], b)
    assert torch.count_nonzero(g) == 0
    assert get_objective("cfpo", kl_coef=0.0).skips_zero_advantage
    assert not get_objective("cfpo").skips_zero_advantage
    # ratios e^±60: the log-ratio is clamped at ±20 as in the authors' code, so the loss stays finite
    far = [[60.0, -60.0, 0.0], [-60.0, 60.0, 0.0]]
    b = batch(old=[[LP[i][t] - far[i][t] for t in range(3)] for i in range(2)])
    loss, _ = get_objective("cfpo", kl_coef=0.0).loss(b)
    assert math.isfinite(loss.item())
    g = grad(loss, b)
    assert torch.isfinite(g).all() and g[0, 0].item() == 0.0 and g[1, 1].item() == 0.0
    with pytest.raises(ValueError, match="tv_eps"):
        get_objective("cfpo", tv_eps=0.0)
