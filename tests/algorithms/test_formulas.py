"""Hand-computed tiny cases (2 sequences, 3 tokens) that pin each objective's formula.

Expected values are written out in plain Python arithmetic from the formulas of docs/objectives.md (the project's
statement of each objective, "The objectives"), independent of the implementation's tensor code.
"""

from __future__ import annotations

import math

import pytest
import torch

from algorithms import PolicyBatch, get_objective

# sequence 0: 3 tokens, Â = +1 ; sequence 1: 2 tokens (+1 pad), Â = −1
LP = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -9.0]]
DELTA = [[0.3, -0.1, 0.0], [-0.4, 0.05, 0.0]]  # lp − old
OLD = [[LP[i][t] - DELTA[i][t] for t in range(3)] for i in range(2)]
REF = [[-1.2, -1.9, -0.6], [-0.2, -1.5, -9.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -1.0]
L_MAX = 4


def batch(lp=LP, old=OLD, ref=REF, adv=ADV, mask=MASK, **extra) -> PolicyBatch:
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in extra.items()}
    return PolicyBatch(logprobs=torch.tensor(lp, dtype=torch.float64, requires_grad=True),
                       old_logprobs=torch.tensor(old, dtype=torch.float64),
                       ref_logprobs=torch.tensor(ref, dtype=torch.float64),
                       advantages=torch.tensor(adv, dtype=torch.float64),
                       mask=torch.tensor(mask, dtype=torch.float64), max_length=L_MAX, **t)


def clip_term(r: float, a: float, lo: float, hi: float) -> float:
    return -min(r * a, min(max(r, 1 - lo), 1 + hi) * a)


def k3(lp: float, ref: float) -> float:
    return math.exp(ref - lp) - (ref - lp) - 1


def tokens():
    return [(i, t) for i in range(2) for t in range(3) if MASK[i][t]]


def per_token_surrogate(lo: float, hi: float) -> dict:
    return {(i, t): clip_term(math.exp(DELTA[i][t]), ADV[i], lo, hi) for i, t in tokens()}


def test_grpo_clipped_surrogate_and_k3():
    pg = per_token_surrogate(0.2, 0.2)
    # token (0,0): r = e^0.3 = 1.35 > 1.2 with Â > 0 -> clipped at 1.2; token (1,0): r = e^-0.4 = 0.67 < 0.8, Â < 0
    assert pg[(0, 0)] == pytest.approx(-1.2)
    assert pg[(1, 0)] == pytest.approx(0.8)
    ell = {k: v + 0.04 * k3(LP[k[0]][k[1]], REF[k[0]][k[1]]) for k, v in pg.items()}
    expected = (sum(ell[(0, t)] for t in range(3)) / 3 + sum(ell[(1, t)] for t in range(2)) / 2) / 2
    loss, m = get_objective("grpo").loss(batch())
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert m["objective/clip_frac_high"].item() == pytest.approx(1 / 5)
    assert m["objective/clip_frac_low"].item() == pytest.approx(1 / 5)
    kl_only = (sum(0.04 * k3(LP[0][t], REF[0][t]) for t in range(3)) / 3
               + sum(0.04 * k3(LP[1][t], REF[1][t]) for t in range(2)) / 2) / 2
    assert m["objective/kl_term"].item() == pytest.approx(kl_only, abs=1e-12)


def test_kl_estimators_k1_k2():
    for est, f in (("k1", lambda lp, ref: lp - ref), ("k2", lambda lp, ref: 0.5 * (lp - ref) ** 2)):
        _, m = get_objective("grpo", kl_estimator=est, kl_coef=1.0).loss(batch())
        expected = (sum(f(LP[0][t], REF[0][t]) for t in range(3)) / 3
                    + sum(f(LP[1][t], REF[1][t]) for t in range(2)) / 2) / 2
        assert m["objective/kl_term"].item() == pytest.approx(expected, abs=1e-12)


def test_dapo_asymmetric_clip_token_mean():
    # ε_high = 0.28 lets r = e^0.3 = 1.35 through only up to 1.28; ε_low = 0.2 unchanged
    pg = per_token_surrogate(0.2, 0.28)
    assert pg[(0, 0)] == pytest.approx(-1.28)
    loss, _ = get_objective("dapo").loss(batch())
    assert loss.item() == pytest.approx(sum(pg.values()) / 5, abs=1e-12)
    # a ratio of 1.25 is clipped by GRPO's 1.2 but not by DAPO's 1.28
    d = [[math.log(1.25), 0, 0], [0, 0, 0]]
    b = dict(old=[[LP[i][t] - d[i][t] for t in range(3)] for i in range(2)])
    _, m_dapo = get_objective("dapo").loss(batch(**b))
    _, m_grpo = get_objective("grpo").loss(batch(**b))
    assert m_dapo["objective/clip_frac_high"].item() == 0
    assert m_grpo["objective/clip_frac_high"].item() == pytest.approx(1 / 5)


def test_dr_grpo_constant_normaliser():
    pg = per_token_surrogate(0.2, 0.2)
    loss, _ = get_objective("dr_grpo").loss(batch())
    assert loss.item() == pytest.approx(sum(pg.values()) / (2 * L_MAX), abs=1e-12)


@pytest.mark.parametrize("delta, inside", [
    # mean log-ratios 1.5e-4/3 = 5e-5 and 2e-4/2 = 1e-4: both inside (−3e-4, 4e-4), so both sequences carry gradient
    ([[2e-4, -1e-4, 5e-5], [3e-4, -1e-4, 0.0]], [True, True]),
    # DELTA: 0.2/3 = 0.067 > 4e-4 with Â = +1 and −0.35/2 < −3e-4 with Â = −1: both clipped, zero gradient
    (DELTA, [False, False]),
])
def test_gspo_sequence_ratio(delta, inside):
    old = [[LP[i][t] - delta[i][t] for t in range(3)] for i in range(2)]
    rho = [math.exp(sum(delta[i][t] for t in range(3) if MASK[i][t]) / sum(MASK[i])) for i in range(2)]
    assert [1 - 3e-4 <= r <= 1 + 4e-4 for r in rho] == inside
    ell = [clip_term(rho[i], ADV[i], 3e-4, 4e-4) for i in range(2)]
    b = batch(old=old)
    loss, m = get_objective("gspo").loss(b)
    assert loss.item() == pytest.approx(sum(ell) / 2, abs=1e-12)
    assert m["objective/ratio_max"].item() == pytest.approx(max(rho))
    # gradient: only sequences whose ρ is inside the clip range carry one, −ρ_i·Â_i/|y_i| per token, over B = 2
    # (inside: seq 0: −e^{5e-5}·1/3/2 = −0.16668, seq 1: −e^{1e-4}·(−1)/2/2 = +0.25003)
    loss.backward()
    for i in range(2):
        for t in range(sum(MASK[i])):
            expected = -(rho[i] * ADV[i] / sum(MASK[i])) / 2 if inside[i] else 0.0
            assert b.logprobs.grad[i, t].item() == pytest.approx(expected, abs=1e-12)
            assert (b.logprobs.grad[i, t].item() != 0) == inside[i]


def test_gspo_gradient_on_policy():
    b = batch(old=LP)
    loss, _ = get_objective("gspo").loss(b)
    loss.backward()
    for i, t in tokens():
        assert b.logprobs.grad[i, t].item() == pytest.approx(-ADV[i] / sum(MASK[i]) / 2, abs=1e-12)


def test_entropy_reg_bonus():
    ent = [[0.5, 1.0, 1.5], [2.0, 0.1, 7.0]]
    _, plain = get_objective("entropy_reg", entropy_coef=0.0).loss(batch(entropy=ent))
    loss, _ = get_objective("entropy_reg").loss(batch(entropy=ent))
    bonus = (sum(ent[0]) / 3 + (ent[1][0] + ent[1][1]) / 2) / 2
    assert loss.item() == pytest.approx(plain["objective/policy_loss"].item() - 1e-3 * bonus, abs=1e-12)


def tepo_case(**extra):
    """H_θ, H_ref chosen so the entropy condition (H_θ < H_ref − 0) holds at (0,0), (0,2), (1,1)."""
    ent = [[0.5, 1.0, 0.2], [1.0, 0.3, 0.0]]
    ref_ent = [[0.9, 0.8, 0.4], [0.7, 0.6, 0.0]]
    return batch(entropy=ent, ref_entropy=ref_ent, old_entropy=ent, **extra)


def test_tepo_sequence_likelihood_value_and_gradient():
    rho = [math.exp(sum(DELTA[i][t] for t in range(3) if MASK[i][t]) / sum(MASK[i])) for i in range(2)]
    b = tepo_case()
    # a clip band wide enough for ρ = 1.069 and 0.839 (the default 3e-4 / 4e-4 clips both: test_offpolicy.py)
    loss, m = get_objective("tepo-no-mask", clip_low=0.2, clip_high=0.28).loss(b)
    ell = {(i, t): clip_term(rho[i], ADV[i], 0.2, 0.28) for i, t in tokens()}
    assert loss.item() == pytest.approx(sum(ell.values()) / 5, abs=1e-12)
    assert m["objective/ratio_mean"].item() == pytest.approx((3 * rho[0] + 2 * rho[1]) / 5)
    loss.backward()
    # d/d lp_it of −s_it Â_i / N = −ρ_i Â_i / N (each token its own gradient), when ρ_i is not clipped
    for i, t in tokens():
        assert b.logprobs.grad[i, t].item() == pytest.approx(-rho[i] * ADV[i] / 5, abs=1e-12)


def test_tepo_mask_selects_positive_advantage_falling_entropy():
    b = tepo_case()
    _, m = get_objective("tepo").loss(b)
    # Â > 0 only for sequence 0; falling entropy at (0,0) and (0,2) there -> 2 of 5 tokens
    assert m["objective/masked_frac"].item() == pytest.approx(2 / 5)
    expected_kl = 0.04 * (k3(LP[0][0], REF[0][0]) + k3(LP[0][2], REF[0][2])) / 5
    assert m["objective/kl_term"].item() == pytest.approx(expected_kl, abs=1e-12)


def test_tepo_entropy_threshold_and_old_baseline():
    _, m = get_objective("tepo", entropy_threshold=0.3).loss(tepo_case())
    assert m["objective/masked_frac"].item() == pytest.approx(1 / 5)  # only (0,0): 0.5 < 0.9 − 0.3
    _, m = get_objective("tepo", entropy_baseline="old").loss(tepo_case())
    assert m["objective/masked_frac"].item() == 0  # H_θ == H_old: nothing has fallen yet


def test_tepo_ablations_differ_exactly_where_they_should():
    results = {n: get_objective(n).loss(tepo_case()) for n in
               ("tepo", "tepo-no-mask", "tepo-mask-all", "tepo-mask-adv", "tepo-mask-entropy")}
    base_loss, base_m = results["tepo"]
    for name, (_loss, m) in results.items():  # the surrogate is untouched by every mask variant
        assert m["objective/policy_loss"].item() == pytest.approx(base_m["objective/policy_loss"].item()), name
    assert results["tepo-no-mask"][1]["objective/kl_term"].item() == 0
    # s = ρ_i clipped to [1 − 3e-4, 1 + 4e-4]: seq 0 (ρ = 1.069, Â = +1): −min(1.069, 1.0004) = −1.0004 per token;
    # seq 1 (ρ = 0.839, Â = −1): −min(−0.839, −0.9997) = 0.9997 per token; token-mean over N = 5
    surrogate = (3 * -1.0004 + 2 * 0.9997) / 5
    assert results["tepo-no-mask"][0].item() == pytest.approx(surrogate, abs=1e-12)
    masked_kl = 0.04 * (k3(LP[0][0], REF[0][0]) + k3(LP[0][2], REF[0][2])) / 5  # M = 1 at (0,0), (0,2)
    assert base_loss.item() == pytest.approx(surrogate + masked_kl, abs=1e-12)
    assert results["tepo-mask-all"][1]["objective/masked_frac"].item() == 1
    assert results["tepo-mask-adv"][1]["objective/masked_frac"].item() == pytest.approx(3 / 5)
    assert results["tepo-mask-entropy"][1]["objective/masked_frac"].item() == pytest.approx(3 / 5)
    all_kl = 0.04 * sum(k3(LP[i][t], REF[i][t]) for i, t in tokens()) / 5
    assert results["tepo-mask-all"][1]["objective/kl_term"].item() == pytest.approx(all_kl, abs=1e-12)


def test_tepo_token_ratio_ablation():
    b = tepo_case()
    loss_tok, m = get_objective("tepo-token-ratio", kl_coef=0.0).loss(b)  # r_it with the token clip 0.2 / 0.28
    pg = per_token_surrogate(0.2, 0.28)
    assert loss_tok.item() == pytest.approx(sum(pg.values()) / 5, abs=1e-12)
    (g,) = torch.autograd.grad(loss_tok, b.logprobs)
    # each token its own ratio: (0,0) r = 1.350 > 1.28 with Â = +1 and (1,0) r = 0.670 < 0.8 with Â = −1 are clipped;
    # (0,1): −e^{−0.1}/5 = −0.1810, (0,2): −1/5, (1,1): +e^{0.05}/5 = 0.2103
    expected = {(0, 0): 0.0, (0, 1): -math.exp(-0.1) / 5, (0, 2): -1 / 5, (1, 0): 0.0, (1, 1): math.exp(0.05) / 5}
    for (i, t), e in expected.items():
        assert g[i, t].item() == pytest.approx(e, abs=1e-12), (i, t)


def test_tepo_seq_mean_ablation():
    loss, _ = get_objective("tepo-seq-mean", kl_coef=0.0).loss(tepo_case())
    rho = [math.exp(sum(DELTA[i][t] for t in range(3) if MASK[i][t]) / sum(MASK[i])) for i in range(2)]
    ell = [clip_term(rho[i], ADV[i], 3e-4, 4e-4) for i in range(2)]  # constant over a sequence's tokens
    assert loss.item() == pytest.approx(sum(ell) / 2, abs=1e-12)


def test_tepo_likelihood_credit():
    b = tepo_case(old=LP)
    loss, _ = get_objective("tepo-likelihood-credit", kl_coef=0.0).loss(b)
    loss.backward()
    for i, t in tokens():
        nll = [-LP[i][s] for s in range(sum(MASK[i]))]
        w = sum(MASK[i]) * nll[t] / sum(nll)
        assert b.logprobs.grad[i, t].item() == pytest.approx(-ADV[i] * w / 5, abs=1e-12)
    # on policy ρ = 1 (no clip); the off-policy case, where old != current, is in test_offpolicy.py


def test_on_policy_grpo_is_reinforce_with_normalised_group_baseline():
    g = torch.Generator().manual_seed(0)
    G, T = 6, 5
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    obj = get_objective("grpo")
    adv = obj.advantages(rewards[None, :])[0]
    lengths = torch.tensor([5, 3, 4, 5, 1, 2])
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    lp = (-torch.rand(G, T, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    b = PolicyBatch(logprobs=lp, old_logprobs=lp.detach(), ref_logprobs=lp.detach(), advantages=adv.double(),
                    mask=mask, max_length=T)
    loss, _ = obj.loss(b)
    (grad,) = torch.autograd.grad(loss, lp)
    baseline = rewards.mean()
    std = rewards.std()
    reinforce = -(((lp * mask).sum(-1) / lengths) * ((rewards - baseline) / (std + 1e-6)).double()).mean()
    (grad_ref,) = torch.autograd.grad(reinforce, lp)
    torch.testing.assert_close(grad, grad_ref)


def test_on_policy_tepo_ratio_is_one_and_gradient_is_token_mean_pg():
    g = torch.Generator().manual_seed(1)
    B, T = 4, 6
    lengths = torch.tensor([6, 2, 4, 3])
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    lp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    h = torch.rand(B, T, generator=g, dtype=torch.float64)
    b = PolicyBatch(logprobs=lp, old_logprobs=lp.detach(), ref_logprobs=lp.detach(), advantages=adv, mask=mask,
                    max_length=T, entropy=h, old_entropy=h, ref_entropy=h + 0.5)
    loss, m = get_objective("tepo").loss(b)
    assert m["objective/ratio_mean"].item() == pytest.approx(1.0)
    assert m["objective/ratio_max"].item() == pytest.approx(1.0)
    (grad,) = torch.autograd.grad(loss, lp)
    pg = -(lp * adv[:, None] * mask).sum() / mask.sum()
    (grad_ref,) = torch.autograd.grad(pg, lp)
    torch.testing.assert_close(grad, grad_ref)


def test_clip_cov_detaches_only_band_tokens():
    g = torch.Generator().manual_seed(2)
    B, T = 8, 16
    lp = (-torch.rand(B, T, generator=g) * 6).requires_grad_(True)
    adv = torch.randn(B, generator=g) * 3
    mask = torch.ones(B, T)
    b = PolicyBatch(logprobs=lp, old_logprobs=lp.detach(), advantages=adv, mask=mask, max_length=T)
    obj = get_objective("clip_cov", clip_cov_frac=0.05)
    loss, m = obj.loss(b, generator=torch.Generator().manual_seed(0))
    (grad,) = torch.autograd.grad(loss, lp)
    cov = (lp.detach() - lp.detach().mean()) * (adv[:, None] - adv.mean())
    in_band = (cov >= 1) & (cov <= 5)
    zeroed = grad == 0
    assert int(zeroed.sum()) == min(int(0.05 * B * T), int(in_band.sum())) > 0
    assert torch.all(in_band[zeroed])  # only band tokens lose their gradient
    assert m["objective/detached_frac"].item() == pytest.approx(zeroed.float().mean().item())


def test_kl_cov_penalises_top_covariance_tokens():
    g = torch.Generator().manual_seed(3)
    B, T = 4, 10
    lp = (-torch.rand(B, T, generator=g) * 4).requires_grad_(True)
    old = lp.detach() + 0.1 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    b = PolicyBatch(logprobs=lp, old_logprobs=old, advantages=adv, mask=torch.ones(B, T), max_length=T)
    loss, m = get_objective("kl_cov", kl_cov_frac=0.1).loss(b)
    cov = ((lp.detach() - lp.detach().mean()) * (adv[:, None] - adv.mean())).flatten()
    top = torch.topk(cov, 4).indices
    expected = (lp.detach() - old).abs().flatten()[top].sum() / (B * T)
    assert m["objective/kl_term"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert m["objective/selected_frac"].item() == pytest.approx(0.1)


def test_forking_tokens_gradient_only_on_high_entropy():
    g = torch.Generator().manual_seed(4)
    B, T = 2, 10
    lp = (-torch.rand(B, T, generator=g)).requires_grad_(True)
    h_old = torch.arange(B * T, dtype=torch.float32).view(B, T)  # highest entropies: the last 4 of row 1
    b = PolicyBatch(logprobs=lp, old_logprobs=lp.detach(), advantages=torch.tensor([1.0, -1.0]),
                    mask=torch.ones(B, T), max_length=T, old_entropy=h_old)
    loss, m = get_objective("forking_tokens").loss(b)
    (grad,) = torch.autograd.grad(loss, lp)
    assert m["objective/selected_frac"].item() == pytest.approx(0.2)
    nz = grad != 0
    assert nz.sum() == 4 and torch.all(nz[1, 6:])
    assert grad[1, 6].item() == pytest.approx(1.0 / (B * T))  # −Â/N with Â = −1, normalised over all tokens


def test_dapo_dynamic_sampling_filter():
    obj = get_objective("dapo")
    outcomes = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.5, 0.4]])
    assert obj.keep_groups(outcomes, outcomes).tolist() == [False, True, False, True]
    assert get_objective("grpo").keep_groups(outcomes, outcomes).tolist() == [True] * 4


def test_dapo_overlong_shaping():
    obj = get_objective("dapo")  # L_max = 100, L_cache = 20: no penalty up to 80, −1 at 100
    lengths = torch.tensor([10, 80, 81, 90, 100, 120])
    shaped = obj.shape_rewards(torch.ones(6), lengths, max_length=100)
    expected = [1.0, 1.0, 1 - 1 / 20, 1 - 10 / 20, 0.0, 0.0]
    assert shaped.tolist() == pytest.approx(expected)
    assert get_objective("grpo").shape_rewards(torch.ones(6), lengths, 100).tolist() == [1.0] * 6


def test_advantage_estimators():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    z = get_objective("grpo").advantages(r)
    std = math.sqrt(sum((x - 0.5) ** 2 for x in (1, 0, 0, 1)) / 3)
    assert z[0].tolist() == pytest.approx([0.5 / (std + 1e-6), -0.5 / (std + 1e-6)] * 1 + [-0.5 / (std + 1e-6),
                                                                                            0.5 / (std + 1e-6)])
    assert get_objective("dr_grpo").advantages(r)[0].tolist() == [0.5, -0.5, -0.5, 0.5]
    assert get_objective("grpo").advantages(torch.ones(1, 4))[0].tolist() == [0.0] * 4
