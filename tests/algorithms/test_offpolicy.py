"""Hand-computed off-policy cases (old != current, so clips, ratios and KL gradients matter).

Each test names the deliberate code mutation it exists to catch; expected values are plain-Python arithmetic from the
formulas of docs/objectives.md, written out in the comments, never the implementation's own tensor code.
"""

from __future__ import annotations

import math

import pytest
import torch

from algorithms import PolicyBatch, aggregate, get_objective

from .test_formulas import ADV, DELTA, LP, MASK, OLD, REF, batch, clip_term, k3, tepo_case, tokens


def grad_of(name: str, b: PolicyBatch, **overrides) -> tuple[float, dict, torch.Tensor]:
    loss, m = get_objective(name, **overrides).loss(b, generator=torch.Generator().manual_seed(0))
    (g,) = torch.autograd.grad(loss, b.logprobs)
    return loss.item(), m, g


def dk3(lp: float, ref: float) -> float:
    """d/dlp of k3 = exp(ref − lp) − (ref − lp) − 1  ->  1 − exp(ref − lp)."""
    return 1.0 - math.exp(ref - lp)


# ---------------------------------------------------------------------------------------------------------- GRPO
def test_grpo_gradient_carries_the_kl_gradient():
    """Catches: GRPO's KL term detached (value unchanged, gradient loses β·(1 − e^{ref−lp}))."""
    _, _, g = grad_of("grpo", batch())
    # surrogate gradient per token, r = e^δ, clip 0.2/0.2:
    #   (0,0) r = e^0.3 = 1.350 > 1.2, Â = +1: clipped -> 0;   (0,1) r = e^-0.1 = 0.905, inside: −r·Â = −0.905
    #   (0,2) r = 1: −1;   (1,0) r = e^-0.4 = 0.670 < 0.8, Â = −1: clipped -> 0
    #   (1,1) r = e^0.05 = 1.051, Â = −1, inside: −r·Â = +1.051
    pg = {(0, 0): 0.0, (0, 1): -math.exp(-0.1), (0, 2): -1.0, (1, 0): 0.0, (1, 1): math.exp(0.05)}
    for i, t in tokens():
        # seq-mean-token-mean over B = 2: each token's term is divided by |y_i| and by 2
        expected = (pg[(i, t)] + 0.04 * dk3(LP[i][t], REF[i][t])) / sum(MASK[i]) / 2
        assert g[i, t].item() == pytest.approx(expected, abs=1e-12), (i, t)
    # the KL part alone is not negligible here: at (0,0) it is the whole gradient, 0.04·(1 − e^{−1.2+1})/3/2
    assert g[0, 0].item() == pytest.approx(0.04 * (1 - math.exp(-0.2)) / 6, abs=1e-12) and g[0, 0].item() != 0


def test_grpo_has_no_dual_clip():
    """Catches: verl's dual clip (loss ≤ −c·Â for Â < 0, c = 3) added to GRPO. GRPO (arXiv 2402.03300, TRL) has none:
    a negative-advantage token with r = 4 keeps the unbounded term −r·Â = 4 and its gradient."""
    d = [[0.0, 0.0, 0.0], [math.log(4.0), 0.0, 0.0]]  # token (1,0): r = 4, Â = −1
    old = [[LP[i][t] - d[i][t] for t in range(3)] for i in range(2)]
    loss, m, g = grad_of("grpo", batch(old=old), kl_coef=0.0)
    # seq 0: r = 1, Â = +1 -> −1 per token, mean −1; seq 1: (1,0) −min(4·(−1), 1.2·(−1)) = −(−4) = 4, (1,1) r = 1 -> +1
    # loss = (−1 + (4 + 1)/2)/2 = 0.75 (a dual clip would give (−1 + (3 + 1)/2)/2 = 0.5)
    assert loss == pytest.approx(0.75, abs=1e-12)
    assert g[1, 0].item() == pytest.approx(4.0 / 2 / 2, abs=1e-12)  # d(−r·Â)/dlp = −Â·r = 4, over |y_1| = 2 and B = 2
    assert m["objective/clip_frac_low"].item() == 0  # r > 1 − ε with Â < 0: the PPO clip does not bind


# ---------------------------------------------------------------------------------------------------------- KL-Cov
def test_kl_cov_unclipped_surrogate_and_penalty():
    """Catches: KL-Cov's surrogate clipped instead of unclipped (arXiv 2505.22617 / verl: −r·Â on every token)."""
    loss, m, g = grad_of("kl_cov", batch(), kl_cov_frac=0.4)
    # covariance over the 5 completion tokens: lp = −1, −2, −0.5, −0.3, −1.2 (mean −1.0); Â = 1, 1, 1, −1, −1 (mean 0.2)
    # (lp − mean)(Â − mean) = 0·0.8, −1·0.8, 0.5·0.8, 0.7·(−1.2), −0.2·(−1.2) = 0, −0.8, 0.4, −0.84, 0.24
    # count max(1, ⌊0.4·5⌋) = 2: the top two are (0,2) (0.4) and (1,1) (0.24); penalty |δ| there = 0 and 0.05
    # −e^δ·Â per token: −1.350, −0.905, −1, 0.670, 1.051
    unclipped = {(i, t): -math.exp(DELTA[i][t]) * ADV[i] for i, t in tokens()}
    assert loss == pytest.approx((sum(unclipped.values()) + 0.05) / 5, abs=1e-12)  # token-mean
    assert m["objective/cov_selected"].item() == 2 and m["objective/selected_frac"].item() == pytest.approx(0.4)
    assert m["objective/kl_term"].item() == pytest.approx(0.05 / 5, abs=1e-12)
    assert m["objective/clip_frac_low"].item() == 0 and m["objective/clip_frac_high"].item() == 0
    # gradient −r·Â/5 everywhere, even where a PPO clip would have removed it ((0,0): r = 1.35; (1,0): r = 0.67),
    # + k·sign(δ)/5 = +1/5 at (1,1); |δ| at (0,2) is 0 with subgradient 0
    for i, t in tokens():
        expected = (unclipped[(i, t)] + (1.0 if (i, t) == (1, 1) else 0.0)) / 5
        assert g[i, t].item() == pytest.approx(expected, abs=1e-12), (i, t)


def test_kl_cov_rollout_correction_weights_the_penalty_too():
    """Catches: KL-Cov's k·|lp − old| left out of the rollout-correction weight (verl multiplies its whole per-token
    policy loss, penalty included, by ``rollout_is_weights``)."""
    # w = exp(old − sampler) = 0.5 at (1,1) (a selected token), 1 elsewhere; token-truncate at C = 2 keeps 0.5
    sampler = [[OLD[i][t] - (math.log(0.5) if (i, t) == (1, 1) else 0.0) for t in range(3)] for i in range(2)]
    loss, _, g = grad_of("kl_cov", batch(sampler_logprobs=sampler), kl_cov_frac=0.4,
                         rollout_correction="token-truncate", rollout_correction_cap=2.0)
    # as test_kl_cov_unclipped_surrogate_and_penalty, with the term at (1,1), −r·Â + |δ| = 1.051 + 0.05, halved
    w = {(i, t): 0.5 if (i, t) == (1, 1) else 1.0 for i, t in tokens()}
    unclipped = {(i, t): -math.exp(DELTA[i][t]) * ADV[i] for i, t in tokens()}
    assert loss == pytest.approx((sum(w[k] * v for k, v in unclipped.items()) + 0.5 * 0.05) / 5, abs=1e-12)
    assert g[1, 1].item() == pytest.approx(0.5 * (unclipped[(1, 1)] + 1.0) / 5, abs=1e-12)


def test_kl_cov_off_policy_mask_drops_the_penalty_too():
    """Catches: KL-Cov's penalty kept on a sequence the off-policy mask dropped (the penalty is policy term)."""
    # sequence 1: Â = −1, mean_t (old − lp) = (0.4 − 0.05)/2 = 0.175 > δ = 0.1: dropped, its penalty 0.05 at (1,1) too
    loss, _, g = grad_of("kl_cov", batch(), kl_cov_frac=0.4, off_policy_mask_threshold=0.1)
    unclipped = {(i, t): -math.exp(DELTA[i][t]) * ADV[i] for i, t in tokens()}
    assert loss == pytest.approx(sum(v for (i, _), v in unclipped.items() if i == 0) / 5, abs=1e-12)
    assert g[1, 1].item() == 0.0


def test_kl_cov_clipped_reading_is_the_v1_formula():
    loss, _, _ = grad_of("kl_cov", batch(), kl_cov_frac=0.4, surrogate="clipped")
    pg = {(i, t): clip_term(math.exp(DELTA[i][t]), ADV[i], 0.2, 0.2) for i, t in tokens()}
    assert loss == pytest.approx((sum(pg.values()) + 0.05) / 5, abs=1e-12)


def test_kl_cov_rejects_clip_fields_it_would_ignore():
    with pytest.raises(ValueError, match="clip_low.*unclipped"):
        get_objective("kl_cov", clip_low=0.3)
    assert get_objective("kl_cov", surrogate="clipped", clip_low=0.3).config.clip_low == 0.3


def test_covariance_selections_take_at_least_one_token():
    # 5 tokens: ⌊2e-4·5⌋ = 0 -> at least 1 (verl's max(1, ⌊r·N⌋)); the selection is reported as a count
    _, m, _ = grad_of("kl_cov", batch())
    assert m["objective/cov_selected"].item() == 1


# ---------------------------------------------------------------------------------------------------------- Clip-Cov
def clip_cov_case() -> PolicyBatch:
    # Â = +2, −2 (token mean 0). lp row 0: −0.2, −0.2, −3.2; row 1: −0.2, −3.2, −0.2 (token mean −1.2)
    # cov = (lp + 1.2)·Â: row 0: 2, 2, −4; row 1: −2, 4, −2  -> strictly inside (1, 5): (0,0), (0,1), (1,1)
    # δ = lp − old: (0,0) 1.0 (r = e = 2.72 > 1 + 1 with Â > 0: the PPO clip of the released scripts removes it),
    # (0,1) 0.1, (1,1) −0.1 (r = 0.905 > 1 − 1 = 0: not clipped); 0 elsewhere
    lp = [[-0.2, -0.2, -3.2], [-0.2, -3.2, -0.2]]
    d = [[1.0, 0.1, 0.0], [0.0, -0.1, 0.0]]
    old = [[lp[i][t] - d[i][t] for t in range(3)] for i in range(2)]
    return PolicyBatch(logprobs=torch.tensor(lp, dtype=torch.float64, requires_grad=True),
                       old_logprobs=torch.tensor(old, dtype=torch.float64),
                       advantages=torch.tensor([2.0, -2.0], dtype=torch.float64),
                       mask=torch.ones(2, 3, dtype=torch.float64), max_length=3)


def test_clip_cov_candidates_exclude_tokens_the_ppo_clip_removed():
    """Catches: Clip-Cov drawing candidates among tokens the PPO clip already removed (verl excludes them)."""
    b = clip_cov_case()
    _, m, g = grad_of("clip_cov", b, clip_cov_frac=0.5)  # count max(1, ⌊0.5·6⌋) = 3 >= the 2 admissible candidates
    assert m["objective/cov_selected"].item() == 2  # (0,1) and (1,1); (0,0) is PPO-clipped, not a candidate
    assert m["objective/detached_frac"].item() == pytest.approx(2 / 6)
    assert m["objective/clip_frac_high"].item() == pytest.approx(1 / 6)
    # gradient −r·Â/6 where neither clip acts: (0,2), (1,0), (1,2) with r = 1: −2/6, +2/6, +2/6; zero elsewhere
    expected = [[0.0, 0.0, -2 / 6], [2 / 6, 0.0, 2 / 6]]
    torch.testing.assert_close(g, torch.tensor(expected, dtype=torch.float64))


def test_clip_cov_selected_tokens_leave_the_loss_value():
    """Catches: Clip-Cov's selected tokens detached but kept in the loss VALUE (verl and the paper's code multiply
    their term by corr = 0: the same gradient, a different loss)."""
    loss, _, _ = grad_of("clip_cov", clip_cov_case(), clip_cov_frac=0.5)
    # selected (0,1), (1,1): 0. (0,0): r = e, Â = +2, −min(2e, clip(e, 0, 2)·2) = −4; (0,2) −2; (1,0), (1,2) +2
    # token-mean over 6 tokens: (−4 − 2 + 2 + 2)/6 (with the detached terms −2e^0.1 and +2e^−0.1 kept it was −0.3999)
    assert loss == pytest.approx(-2 / 6, abs=1e-12)


def test_clip_cov_band_is_strict():
    # Â = +1, −1 (token mean 0); lp row 0: −1, −3; row 1: −3, −1 (mean −2): cov = (lp + 2)·Â = 1, −1 | 1, −1.
    # verl takes cov_low < cov < cov_high: a covariance of exactly 1 is not a candidate, so nothing is detached
    lp = torch.tensor([[-1.0, -3.0], [-3.0, -1.0]], dtype=torch.float64, requires_grad=True)
    b = PolicyBatch(logprobs=lp, old_logprobs=lp.detach(), advantages=torch.tensor([1.0, -1.0], dtype=torch.float64),
                    mask=torch.ones(2, 2, dtype=torch.float64), max_length=2)
    _, m, _ = grad_of("clip_cov", b, clip_cov_frac=0.5)
    assert m["objective/cov_selected"].item() == 0


def test_clip_cov_default_clip_is_the_released_scripts():
    # recipe/dapo/7b_clip_cov.sh: clip_ratio_low = clip_ratio_high = 1 -> r clipped at 2, no lower clip
    c = get_objective("clip_cov").config
    assert (c.clip_low, c.clip_high) == (1.0, 1.0)


# ---------------------------------------------------------------------------------------------------------- TEPO
def test_tepo_gradient_carries_the_masked_kl_gradient():
    """Catches: TEPO's KL term detached."""
    _, m, g = grad_of("tepo", tepo_case())
    # default clip 3e-4 / 4e-4 on s_it = ρ_i: ρ_0 = e^{0.2/3} = 1.069 > 1.0004 with Â = +1 and ρ_1 = e^{−0.35/2} = 0.839
    # < 0.9997 with Â = −1: both clipped, so the surrogate gives no gradient and what remains is the masked KL:
    # β·M·(1 − e^{ref−lp})/N at the masked tokens (0,0) and (0,2) (Â > 0, H_θ < H_ref), N = 5
    assert m["objective/clip_frac_low"].item() == pytest.approx(2 / 5)
    assert m["objective/clip_frac_high"].item() == pytest.approx(3 / 5)
    for i, t in tokens():
        expected = 0.04 * dk3(LP[i][t], REF[i][t]) / 5 if (i, t) in ((0, 0), (0, 2)) else 0.0
        assert g[i, t].item() == pytest.approx(expected, abs=1e-12), (i, t)
    assert g[0, 0].item() == pytest.approx(0.04 * (1 - math.exp(-0.2)) / 5, abs=1e-12) != 0


def test_tepo_mask_advantage_condition_is_strict():
    """Catches: the mask using Â ≥ τ_A instead of Â > τ_A."""
    # Â_0 = τ_A = 0.5 exactly: sequence 0 is NOT "positive-advantage"; sequence 1 has Â = −1
    _, m = get_objective("tepo", adv_threshold=0.5).loss(tepo_case(adv=[0.5, -1.0]))
    assert m["objective/masked_frac"].item() == 0
    _, m = get_objective("tepo").loss(tepo_case(adv=[0.0, -1.0]))  # τ_A = 0 and Â = 0: same
    assert m["objective/masked_frac"].item() == 0


def test_tepo_likelihood_credit_uses_the_old_log_probs():
    """Catches: the likelihood credit computed from the current instead of the sampling policy's log-probs."""
    old = [[-1.2, -2.1, -0.4], [-0.5, -1.0, -9.0]]
    b = tepo_case(old=old)
    loss, _, g = grad_of("tepo-likelihood-credit", b, kl_coef=0.0, clip_low=0.5, clip_high=0.5)
    # δ = lp − old: row 0: 0.2, 0.1, −0.1 (ρ_0 = e^{0.2/3}); row 1: 0.2, −0.2 (ρ_1 = e^0 = 1); clip 0.5 binds nowhere
    rho = [math.exp(0.2 / 3), 1.0]
    # w_it = |y_i|·(−old_it)/Σ_t(−old_it): row 0: 3·(1.2, 2.1, 0.4)/3.7; row 1: 2·(0.5, 1.0)/1.5
    # (from the CURRENT log-probs it would be 3·(1, 2, 0.5)/3.5 and 2·(0.3, 1.2)/1.5)
    w = [[3 * 1.2 / 3.7, 3 * 2.1 / 3.7, 3 * 0.4 / 3.7], [2 * 0.5 / 1.5, 2 * 1.0 / 1.5, 0.0]]
    # ℓ_it = −s_it·Â_i·w_it with value ρ_i and ∂s_it/∂lp_it = ρ_i; token-mean over N = 5
    assert loss == pytest.approx(sum(-rho[i] * ADV[i] * w[i][t] for i, t in tokens()) / 5, abs=1e-12)
    for i, t in tokens():
        assert g[i, t].item() == pytest.approx(-rho[i] * ADV[i] * w[i][t] / 5, abs=1e-12), (i, t)


def test_tepo_kl_to_old_ablation_is_a_trust_region():
    _, m = get_objective("tepo-kl-old").loss(tepo_case())
    # masked tokens (0,0), (0,2); KL to π_old: k3(lp, old) with old = lp − δ: δ(0,0) = 0.3, δ(0,2) = 0 -> k3 = 0 there
    expected = 0.04 * (k3(LP[0][0], LP[0][0] - 0.3) + 0.0) / 5  # k3 = e^{−0.3} + 0.3 − 1 = 0.0408
    assert m["objective/kl_term"].item() == pytest.approx(expected, abs=1e-12)
    assert get_objective("tepo-kl-old").needs_reference  # H_ref still drives the entropy condition
    assert not get_objective("tepo-kl-old", entropy_baseline="old").needs_reference


def test_tepo_entropy_old_ablation_uses_the_sampling_entropy():
    # H_θ = (0.5, 1.0, 0.2 | 1.0, 0.3), H_old = (0.6, 0.9, 0.3 | 0.5, 0.5): fallen at (0,0), (0,2), (1,1);
    # with Â > 0 only sequence 0 -> (0,0), (0,2): 2 of 5
    ent = [[0.5, 1.0, 0.2], [1.0, 0.3, 0.0]]
    old_ent = [[0.6, 0.9, 0.3], [0.5, 0.5, 0.0]]
    b = batch(entropy=ent, old_entropy=old_ent)  # no H_ref: the ablation must not need it
    _, m = get_objective("tepo-entropy-old").loss(b)
    assert m["objective/masked_frac"].item() == pytest.approx(2 / 5)
    expected = 0.04 * (k3(LP[0][0], REF[0][0]) + k3(LP[0][2], REF[0][2])) / 5
    assert m["objective/kl_term"].item() == pytest.approx(expected, abs=1e-12)


def test_tepo_clip_binds_at_the_measured_sequence_ratios():
    # under minibatches=4, lr 3e-5 the median |log ρ_i| measured is ~5e-4 (docs/objectives.md): a sequence at
    # log ρ = 1e-3 with Â > 0 is clipped by the default 4e-4, one at 1e-4 is not
    d = [[1e-3, 1e-3, 1e-3], [1e-4, 1e-4, 0.0]]
    old = [[LP[i][t] - d[i][t] for t in range(3)] for i in range(2)]
    _, m = get_objective("tepo-no-mask").loss(tepo_case(old=old, adv=[1.0, 1.0]))
    assert m["objective/clip_frac_high"].item() == pytest.approx(3 / 5)


# ---------------------------------------------------------------------------------------------------------- aggregation
def test_sequence_mean_counts_empty_sequences():
    """Catches: seq-mean over non-empty sequences only. The loop weights a micro-batch by its number of sequences
    (empty ones included), so the mean must be over all B rows for the accumulated gradient to be the full one."""
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    # per-sequence means 1.5, 0 (empty), 8 -> (1.5 + 0 + 8)/3 = 3.1667 (non-empty only: 9.5/2 = 4.75)
    assert aggregate(values, mask, "seq-mean-token-mean", 3).item() == pytest.approx(9.5 / 3)
    # same through GRPO: an empty third completion changes B from 2 to 3
    lp3 = [*LP, [-1.0, -1.0, -1.0]]
    three = PolicyBatch(logprobs=torch.tensor(lp3, dtype=torch.float64),
                        old_logprobs=torch.tensor(lp3, dtype=torch.float64),
                        advantages=torch.tensor([1.0, 1.0, 0.5], dtype=torch.float64),
                        mask=torch.tensor([*MASK, [0, 0, 0]], dtype=torch.float64), max_length=4)
    loss, _ = get_objective("grpo", kl_coef=0.0).loss(three)
    # on policy r = 1, so ℓ = −Â per token: seq 0: −1, seq 1: −1, seq 2: empty -> 0
    assert loss.item() == pytest.approx(-2 / 3, abs=1e-12)  # (−1 − 1 + 0)/3 (non-empty only: −1)


# ---------------------------------------------------------------------------------------------------------- DAPO
def test_dapo_dynamic_sampling_filters_on_accuracy_not_shaped_reward():
    obj = get_objective("dapo")
    outcomes = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    # group 0: all correct, but overlong shaping made the shaped rewards differ -> still dropped (nothing to learn:
    # same answer quality); group 3: a correct-but-overlong answer shaped to 0 ties with the wrong one -> kept
    shaped = torch.tensor([[1.0, 0.5, 1.0], [0.0, 1.0, 0.0], [0.0, -0.5, 0.0], [0.0, 0.0, 0.0]])
    assert obj.keep_groups(shaped, outcomes).tolist() == [False, True, False, True]
    assert get_objective("grpo").keep_groups(shaped, outcomes).tolist() == [True] * 4
