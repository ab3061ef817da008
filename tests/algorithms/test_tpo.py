"""TPO (arXiv 2604.06159) on small hand-computed groups: the target q, the loss, its gradient p^θ − q on the sequence
log-probs, the population std, the all-equal group, η, the token sum."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms import PolicyBatch, get_objective
from algorithms.tpo import population_standardized


def _batch(lp, old, adv, mask=None, G=None, **kw) -> PolicyBatch:
    lp = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    old = torch.tensor(old, dtype=torch.float64)
    mask = torch.ones_like(old) if mask is None else torch.tensor(mask, dtype=torch.float64)
    return PolicyBatch(logprobs=lp, old_logprobs=old, advantages=torch.tensor(adv, dtype=torch.float64), mask=mask,
                       max_length=lp.shape[1], group_size=G or lp.shape[0], **kw)


def _softmax(xs):
    z = [math.exp(x) for x in xs]
    return [v / sum(z) for v in z]


def test_population_std_not_bessel():
    # rewards (1, 0, 0, 0): mean 1/4, population var 3/16, σ = √3/4 -> u = (√3, −1/√3, −1/√3, −1/√3)
    u = population_standardized(torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64))
    s3 = math.sqrt(3.0)
    torch.testing.assert_close(u, torch.tensor([[s3, -1 / s3, -1 / s3, -1 / s3]], dtype=torch.float64))
    # (Bessel's σ = 1/2 would give (1.5, −0.5, −0.5, −0.5)); the population-standardised u has mean 0, mean square 1
    assert abs(float(u.pow(2).mean()) - 1.0) < 1e-12
    # the objective's hook is the same, and an all-equal group (σ = 0 <= 1e-6) gets u = 0 exactly
    obj = get_objective("tpo")
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.3, 0.3 + 1e-7, 0.3, 0.3]], dtype=torch.float64)
    u2 = obj.advantages(r)
    torch.testing.assert_close(u2[0], u[0])
    assert torch.all(u2[1:] == 0)


def test_target_loss_and_gradient_by_hand():
    # one group of 3, two tokens each (all counted): ℓ^old = (−1, −2, −3), ℓ^θ = (−1.5, −1.5, −2), u = (1, 0, −1)
    old = [[-0.5, -0.5], [-1.0, -1.0], [-2.0, -1.0]]
    lp = [[-1.0, -0.5], [-0.5, -1.0], [-1.5, -0.5]]
    u = [1.0, 0.0, -1.0]
    b = _batch(lp, old, u)
    loss, m = get_objective("tpo").loss(b)
    q = _softmax([-1 + 1, -2 + 0, -3 - 1])
    p = _softmax([-1.5, -1.5, -2.0])
    want = -sum(qi * math.log(pi) for qi, pi in zip(q, p))
    assert abs(float(loss.detach()) - want) < 1e-12
    assert abs(float(m["objective/policy_loss"]) - want) < 1e-12
    (g,) = torch.autograd.grad(loss, b.logprobs)
    # d loss / d ℓ_i = p_i − q_i, and d ℓ_i / d lp_it = m_it: every token of completion i gets p_i − q_i
    want_g = torch.tensor([[pi - qi] * 2 for pi, qi in zip(p, q)], dtype=torch.float64)
    torch.testing.assert_close(g, want_g)


def test_token_sum_not_mean():
    # lengths 1 and 3 (padding carries garbage): ℓ^old = (−1, −3), ℓ^θ = (−2, −1.5); u = (1, −1)
    old = [[-1.0, 9.0, 9.0], [-1.0, -1.0, -1.0]]
    lp = [[-2.0, 7.0, 7.0], [-0.5, -0.5, -0.5]]
    mask = [[1, 0, 0], [1, 1, 1]]
    b = _batch(lp, old, [1.0, -1.0], mask=mask)
    loss, _ = get_objective("tpo").loss(b)
    q, p = _softmax([-1 + 1, -3 - 1]), _softmax([-2.0, -1.5])
    assert abs(float(loss.detach()) + sum(qi * math.log(pi) for qi, pi in zip(q, p))) < 1e-12


def test_eta_scales_the_target():
    old, lp, u = [[-1.0], [-1.0]], [[-1.0], [-1.0]], [1.0, -1.0]
    for eta in (1.0, 0.5, 4.0):
        loss, _ = get_objective("tpo", eta=eta).loss(_batch(lp, old, u))
        q = _softmax([1 / eta, -1 / eta])
        want = -sum(qi * math.log(0.5) for qi in q)  # p uniform: the loss is log 2 whatever q ...
        assert abs(float(loss.detach()) - want) < 1e-12
        (g,) = torch.autograd.grad(get_objective("tpo", eta=eta).loss(b := _batch(lp, old, u))[0], b.logprobs)
        # ... but the gradient p − q is η's: q_1 = σ(2/η)
        q1 = 1 / (1 + math.exp(-2 / eta))
        torch.testing.assert_close(g, torch.tensor([[0.5 - q1], [q1 - 0.5]], dtype=torch.float64))


def test_all_equal_group_no_gradient_at_old_then_gradient_after_theta_moves():
    obj = get_objective("tpo")
    old = [[-1.0, -0.2], [-0.3, -0.4], [-2.0, -0.1]]
    u = population_standardized(torch.tensor([[1.0, 1.0, 1.0]])).reshape(-1).tolist()  # σ = 0: u = 0
    assert u == [0.0, 0.0, 0.0]
    b = _batch(old, old, u)  # θ = θ_old: q = p^old = p^θ
    (g,) = torch.autograd.grad(obj.loss(b)[0], b.logprobs)
    assert float(g.abs().max()) < 1e-12
    moved = [[-0.5, -0.2], [-0.3, -0.4], [-2.0, -0.1]]  # θ has moved (a later minibatch / epoch)
    b = _batch(moved, old, u)
    (g,) = torch.autograd.grad(obj.loss(b)[0], b.logprobs)
    p, q = _softmax([-0.7, -0.7, -2.1]), _softmax([-1.2, -0.7, -2.1])
    torch.testing.assert_close(g, torch.tensor([[pi - qi] * 2 for pi, qi in zip(p, q)], dtype=torch.float64))
    assert float(g.abs().max()) > 1e-2
    assert not obj.skips_zero_advantage and obj.needs_whole_groups


def test_softmax_per_group_and_mean_over_groups():
    # two groups of 2; the loss is the mean of the two groups' cross-entropies (not one softmax over 4 rows)
    old = [[-1.0], [-2.0], [-0.5], [-0.5]]
    lp = [[-1.5], [-1.0], [-3.0], [-0.5]]
    u = [1.0, -1.0, 1.0, -1.0]
    b = _batch(lp, old, u, G=2)
    loss, _ = get_objective("tpo").loss(b)
    ce = []
    for (l0, l1), (o0, o1) in (((-1.5, -1.0), (-1.0, -2.0)), ((-3.0, -0.5), (-0.5, -0.5))):
        q, p = _softmax([o0 + 1, o1 - 1]), _softmax([l0, l1])
        ce.append(-sum(qi * math.log(pi) for qi, pi in zip(q, p)))
    assert abs(float(loss.detach()) - sum(ce) / 2) < 1e-12
    (g,) = torch.autograd.grad(loss, b.logprobs)
    for k, ((l0, l1), (o0, o1)) in enumerate((((-1.5, -1.0), (-1.0, -2.0)), ((-3.0, -0.5), (-0.5, -0.5)))):
        q, p = _softmax([o0 + 1, o1 - 1]), _softmax([l0, l1])
        torch.testing.assert_close(g[2 * k:2 * k + 2, 0], torch.tensor([(p[0] - q[0]) / 2, (p[1] - q[1]) / 2],
                                                                       dtype=torch.float64))


def test_the_target_does_not_move_with_theta():
    """On-policy the native step hands lp itself as π_old (PolicyBatch detaches it): q = softmax(ℓ^old + u/η) is a
    constant, so the gradient is p − q, not that of a target that follows θ."""
    lp = torch.tensor([[-1.5], [-1.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64, requires_grad=True)
    b = PolicyBatch(logprobs=lp, old_logprobs=lp, advantages=adv, mask=torch.ones(2, 1, dtype=torch.float64),
                    max_length=1, group_size=2)
    (g,) = torch.autograd.grad(get_objective("tpo").loss(b)[0], lp)
    q = _softmax([-1.5 + 1, -1.0 - 1])
    p = _softmax([-1.5, -1.0])
    torch.testing.assert_close(g[:, 0], torch.tensor([p[0] - q[0], p[1] - q[1]], dtype=torch.float64))
    assert adv.grad is None


def test_the_group_size_is_required_and_checked():
    obj = get_objective("tpo")
    b = _batch([[-1.0], [-1.0]], [[-1.0], [-1.0]], [1.0, -1.0])
    with pytest.raises(ValueError, match="group_size"):
        obj.loss(PolicyBatch(logprobs=b.logprobs, old_logprobs=b.old_logprobs, advantages=b.advantages, mask=b.mask,
                             max_length=1))
    with pytest.raises(ValueError, match="whole groups"):
        _batch([[-1.0]] * 3, [[-1.0]] * 3, [0.0] * 3, G=2)


def test_config_checks_and_the_kl_term():
    with pytest.raises(ValueError, match="eta"):
        get_objective("tpo", eta=0.0)
    with pytest.raises(ValueError, match="advantage_estimator"):
        get_objective("tpo", advantage_estimator="group")
    obj = get_objective("tpo", kl_coef=0.1)
    assert obj.needs_reference and "ref_logprobs" in obj.batch_fields
    assert not get_objective("tpo").needs_reference
    lp, old = [[-1.0, -0.5], [-0.5, -1.0]], [[-1.0, -0.5], [-0.5, -1.0]]
    ref = torch.tensor([[-1.2, -0.5], [-0.5, -0.7]], dtype=torch.float64)
    plain = get_objective("tpo").loss(_batch(lp, old, [1.0, -1.0]))[0]
    with_kl, m = obj.loss(_batch(lp, old, [1.0, -1.0], ref_logprobs=ref))
    # k3 = exp(ref − lp) − (ref − lp) − 1 per token, token mean per completion, mean over completions
    d = ref - torch.tensor(lp, dtype=torch.float64)
    k3 = (d.exp() - d - 1).mean(-1).mean()
    torch.testing.assert_close(with_kl, plain + 0.1 * k3)
    torch.testing.assert_close(m["objective/kl_term"], k3)


def test_tpo_target_is_a_constant_for_any_caller():
    """(PolicyBatch already detaches ℓ^old and u; ``tpo_target`` detaches too, for a caller that hands it tensors with
    gradient.)"""
    from algorithms.tpo import tpo_target

    ell = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    q = tpo_target(ell, torch.tensor([[1.0, -1.0]]), 1.0)
    assert not q.requires_grad
    torch.testing.assert_close(q[0], torch.tensor(_softmax([0.0, -3.0]), dtype=torch.float32))
