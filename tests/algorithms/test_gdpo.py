"""GDPO's advantage (``gdpo``, algorithms.advantages.gdpo_advantages) by hand arithmetic: each reward component
z-scored within its group on its own (Bessel std + 1e-6; a group of one r/(1 + 1e-6)), weighted sum, whitened over
the batch's tokens (Bessel, + 1e-8 under the root). Each test names the plausible wrong line it catches."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from algorithms import get_objective, group_advantages
from algorithms.advantages import REWARD_COMPONENTS, gdpo_advantages

# 2 prompts x 3 completions, components (correct, format, overlong) per completion
C = [[[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -0.5]],
     [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, -0.25]]]
L = [[2, 1, 3], [1, 1, 4]]


def z(values):
    """verl's GRPO score of one group: (r − mean)/(stdev + 1e-6), a group of one r/(1 + 1e-6)."""
    if len(values) == 1:
        return [values[0] / (1 + 1e-6)]
    m, s = statistics.fmean(values), statistics.stdev(values)
    return [(v - m) / (s + 1e-6) for v in values]


def by_hand(comps, lengths, weights=(1.0, 1.0, 1.0)):
    P, G, K = len(comps), len(comps[0]), len(weights)
    total = [[0.0] * G for _ in range(P)]
    for p in range(P):
        for k in range(K):
            for i, v in enumerate(z([comps[p][i][k] for i in range(G)])):
                total[p][i] += weights[k] * v
    flat = [(total[p][i], lengths[p][i]) for p in range(P) for i in range(G)]
    n = sum(w for _, w in flat)
    mean = sum(s * w for s, w in flat) / n
    var = sum(w * (s - mean) ** 2 for s, w in flat) / (n - 1)
    return [[(total[p][i] - mean) / math.sqrt(var + 1e-8) for i in range(G)] for p in range(P)]


def ours(comps, lengths, weights=None, **kw):
    c = torch.tensor(comps, dtype=torch.float64)
    rewards = c[..., 0] + c[..., 2]  # the scalar reward other estimators read: outcome + overlong penalty
    return group_advantages(rewards, "gdpo", lengths=torch.tensor(lengths), reward_components=c,
                            component_weights=weights, **kw)


def close(a, b, tol=1e-9):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               rtol=tol, atol=tol)


def test_components_normalised_apart_then_summed_then_token_whitened():
    close(ours(C, L), by_hand(C, L))


def test_not_grpo_on_the_summed_reward():
    """Wrong line: z-score the (weighted) SUM of the components within the group (GRPO on the total reward)."""
    summed = [[[sum(c)] for c in row] for row in C]
    assert not torch.allclose(ours(C, L), torch.tensor(by_hand(summed, L, weights=(1.0,)), dtype=torch.float64),
                              atol=1e-3)


TINY = [[[0.0, 1.0, 0.0], [1e-6, 0.0, 0.0], [0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]]
ONES = [[1, 1, 1], [1, 1, 1]]


def z_scores(comps, std):
    """(P, G, K) per-component group z-scores with ``std`` (a function of a list) + 1e-6; 0 where std is 0 and eps
    is left out (``std`` returning (s, eps))."""
    out = [[[0.0] * len(comps[0][0]) for _ in comps[0]] for _ in comps]
    for p, row in enumerate(comps):
        for k in range(len(row[0])):
            vals = [c[k] for c in row]
            m, (s, eps) = statistics.fmean(vals), std(vals)
            for i, v in enumerate(vals):
                out[p][i][k] = 0.0 if s + eps == 0 else (v - m) / (s + eps)
    return out


def test_bessel_std_in_the_group():
    """Wrong line: population std (÷G). With every group of one size G its factor sqrt(G/(G−1)) is common to all
    components and groups, and the whitening removes it, except where the 1e-6 is comparable to a component's std:
    there the two weigh that component differently against the others, so the test looks there and at the group
    z-score itself."""
    from algorithms.advantages import _verl_group_z

    close(_verl_group_z(torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)),
          [[(v - 0.6) / (statistics.stdev([1, 0, 0, 1, 1]) + 1e-6) for v in (1, 0, 0, 1, 1)]])
    population = z_scores(TINY, lambda v: (statistics.pstdev(v), 1e-6))
    close(ours(TINY, ONES), by_hand(TINY, ONES))
    assert not torch.allclose(ours(TINY, ONES), torch.tensor(by_hand_identity(population, ONES),
                                                             dtype=torch.float64), atol=1e-3)


def by_hand_identity(zs, lengths):
    flat = [(sum(zs[p][i]), lengths[p][i]) for p in range(len(zs)) for i in range(len(zs[0]))]
    n = sum(w for _, w in flat)
    mean = sum(s * w for s, w in flat) / n
    var = sum(w * (s - mean) ** 2 for s, w in flat) / (n - 1)
    G = len(zs[0])
    return [[(flat[p * G + i][0] - mean) / math.sqrt(var + 1e-8) for i in range(G)] for p in range(len(zs))]


def test_epsilon_is_added_to_the_std_of_each_component():
    """A component whose spread is ~1e-6 beside one of spread ~0.5: the 1e-6 on its std decides how much it weighs
    against the other after the sum (whitening cannot undo a ratio). Wrong lines: no eps, sqrt(var + eps)."""
    close(ours(TINY, ONES), by_hand(TINY, ONES))
    for wrong in (lambda v: (statistics.stdev(v), 0.0), lambda v: (math.sqrt(statistics.variance(v) + 1e-6), 0.0)):
        assert not torch.allclose(ours(TINY, ONES), torch.tensor(by_hand_identity(z_scores(TINY, wrong), ONES),
                                                                 dtype=torch.float64), atol=1e-3)


def test_a_group_of_one_keeps_its_components_as_verl():
    """verl gives a group of one mean 0 and std 1: r/(1 + 1e-6) per component, not 0 (wrong line: centre it)."""
    comps = [[[1.0, 1.0, 0.0]], [[0.0, 1.0, -0.5]], [[1.0, 0.0, 0.0]]]
    lengths = [[3], [1], [2]]
    got = ours(comps, lengths)
    close(got, by_hand(comps, lengths))
    assert got.abs().max() > 0.5


def test_whitened_over_tokens_not_completions():
    """Wrong line: whiten the completions' sums with one weight each (lengths ignored)."""
    got = ours(C, L)
    close(got, by_hand(C, L))
    assert not torch.allclose(got, torch.tensor(by_hand(C, [[1] * 3, [1] * 3]), dtype=torch.float64), atol=1e-3)


def test_weights_scale_each_component_before_the_sum():
    w = (2.0, 0.0, 0.5)
    close(ours(C, L, weights=w), by_hand(C, L, weights=w))
    # weight 0 leaves the component out: the format column can then be anything
    other = [[[c[0], 7.0 * i, c[2]] for i, c in enumerate(row)] for row in C]
    close(ours(other, L, weights=w), ours(C, L, weights=w))


def test_all_equal_components_give_no_advantage_and_no_nan():
    comps = [[[1.0, 1.0, 0.0]] * 3, [[0.0, 0.0, 0.0]] * 3]
    got = ours(comps, L)
    assert torch.isfinite(got).all() and got.abs().max() == 0.0


def test_the_components_are_read_not_the_scalar_reward():
    c = torch.tensor(C, dtype=torch.float64)
    a = group_advantages(torch.zeros(2, 3, dtype=torch.float64), "gdpo", lengths=torch.tensor(L),
                         reward_components=c)
    close(a, by_hand(C, L))


def test_missing_or_misshapen_components_are_refused():
    with pytest.raises(ValueError, match="reward's components"):
        group_advantages(torch.zeros(2, 3), "gdpo", lengths=torch.tensor(L))
    with pytest.raises(ValueError, match="reward's components"):
        group_advantages(torch.zeros(2, 3), "gdpo", lengths=torch.tensor(L), reward_components=torch.zeros(2, 3, 2))
    with pytest.raises(ValueError, match="lengths"):
        group_advantages(torch.zeros(2, 3), "gdpo", reward_components=torch.zeros(2, 3, 3))


def test_the_objective_passes_its_weights_and_declares_its_inputs():
    obj = get_objective("gdpo", gdpo_weight_format=0.0, gdpo_weight_overlong=3.0)
    assert obj.advantage_needs == ("lengths", "reward_components")
    assert obj.config.gdpo_weights == (1.0, 0.0, 3.0) and REWARD_COMPONENTS == ("correct", "format", "overlong")
    c = torch.tensor(C, dtype=torch.float64)
    got = obj.advantages(c[..., 0] + c[..., 2], lengths=torch.tensor(L), reward_components=c)
    close(got, by_hand(C, L, weights=(1.0, 0.0, 3.0)))
    assert get_objective("grpo", advantage_estimator="gdpo").advantage_needs == ("lengths", "reward_components")


def test_weights_outside_gdpo_and_all_zero_weights_are_refused():
    with pytest.raises(ValueError, match="gdpo_weight_format.*acts only with advantage_estimator='gdpo'"):
        get_objective("grpo", gdpo_weight_format=0.5)
    with pytest.raises(ValueError, match="every GDPO component weight is 0"):
        get_objective("gdpo", gdpo_weight_correct=0.0, gdpo_weight_format=0.0, gdpo_weight_overlong=0.0)


def test_gdpo_advantages_checks_shapes():
    with pytest.raises(ValueError, match="gdpo"):
        gdpo_advantages(torch.zeros(2, 3, 3), torch.ones(2, 4), torch.ones(3))


def test_has_answer_marker():
    from evaluators.verify import has_answer_marker

    assert has_answer_marker("2 + 3 = 5\n#### 5") and has_answer_marker("so \\boxed{\\frac{1}{2}}.")
    assert not has_answer_marker("the answer is 5") and not has_answer_marker("#### Heading\n5")
    assert not has_answer_marker("\\boxed{}") and not has_answer_marker("")
