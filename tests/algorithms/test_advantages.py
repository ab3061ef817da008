"""Hand-computed 2 x 3 cases for every advantage estimator (2 prompts, 3 completions each)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from algorithms import get_objective, group_advantages
from algorithms.advantages import ADVANTAGE_ESTIMATORS, ESTIMATOR_NEEDS

R = [[1.0, 0.0, 0.5], [0.0, 0.0, 1.0]]
L = [[4, 2, 6], [3, 5, 1]]


def adv(estimator, **kw):
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in kw.items()}
    return group_advantages(torch.tensor(R, dtype=torch.float64), estimator, **t).tolist()


def close(a, b):
    for ra, rb in zip(a, b):
        assert ra == pytest.approx(rb, abs=1e-9)


def test_rloo_leave_one_out_baseline():
    close(adv("rloo"), [[r - (sum(row) - r) / 2 for r in row] for row in R])


def test_group_batch_std():
    sd = statistics.stdev([r for row in R for r in row])
    close(adv("group-batch-std"), [[(r - sum(row) / 3) / (sd + 1e-6) for r in row] for row in R])


def whiten(values, weights):
    n = sum(weights)
    mu = sum(w * v for v, w in zip(values, weights)) / n
    var = sum(w * (v - mu) ** 2 for v, w in zip(values, weights)) / n * n / (n - 1)
    return [(v - mu) / math.sqrt(var + 1e-8) for v in values]


def test_reinforce_pp_token_weighted_batch_whitening():
    flat = whiten([r for row in R for r in row], [x for row in L for x in row])
    close(adv("reinforce++", lengths=L), [flat[:3], flat[3:]])


def test_reinforce_pp_baseline_subtracts_the_group_mean_first():
    centred = [r - sum(row) / 3 for row in R for r in row]
    flat = whiten(centred, [x for row in L for x in row])
    close(adv("reinforce++-baseline", lengths=L), [flat[:3], flat[3:]])


def test_grpo_passk_only_the_best_completion():
    sd0, sd1 = statistics.stdev(R[0]), statistics.stdev(R[1])
    close(adv("grpo-passk"), [[(1.0 - 0.5) / (sd0 + 1e-6), 0.0, 0.0], [0.0, 0.0, 1.0 / (sd1 + 1e-6)]])


def test_opo_length_weighted_baseline():
    b = [sum(r * n for r, n in zip(R[p], L[p])) / sum(L[p]) for p in range(2)]
    close(adv("opo", lengths=L), [[r - b[p] for r in R[p]] for p in range(2)])


def test_gpg_scales_by_batch_over_nonzero_rewards():
    alpha = 6 / 3  # three non-zero rewards among six
    close(adv("gpg"), [[alpha * (r - sum(row) / 3) for r in row] for row in R])


def test_remax_greedy_baseline():
    close(adv("remax", greedy_rewards=[0.5, 1.0]), [[0.5, -0.5, 0.0], [-1.0, -1.0, 0.0]])


@pytest.mark.parametrize("estimator", sorted(ESTIMATOR_NEEDS))
def test_missing_inputs_are_named(estimator):
    with pytest.raises(ValueError, match=estimator.replace("+", r"\+")):
        group_advantages(torch.tensor(R), estimator)


def test_objective_declares_what_its_estimator_needs():
    assert get_objective("remax").advantage_needs == ("greedy_rewards",)
    assert get_objective("opo").advantage_needs == ("lengths",)
    assert get_objective("grpo").advantage_needs == ()
    assert get_objective("grpo", advantage_estimator="remax").advantage_needs == ("greedy_rewards",)
    got = get_objective("dapo", advantage_estimator="opo").advantages(torch.tensor(R), lengths=torch.tensor(L))
    assert got.shape == (2, 3)


@pytest.mark.parametrize("estimator", ADVANTAGE_ESTIMATORS)
def test_every_estimator_is_finite_and_shaped(estimator):
    out = group_advantages(torch.tensor(R), estimator, lengths=torch.tensor(L), greedy_rewards=torch.tensor([0., 1.]),
                           reward_components=torch.stack([torch.tensor(R), torch.tensor(R) > 0, torch.zeros(2, 3)], -1))
    assert out.shape == (2, 3) and torch.isfinite(out).all()


def test_maxrl_divides_the_centred_reward_by_the_group_mean():
    # R's rows have means 0.5 and 1/3: (r − m)/m
    close(adv("maxrl"), [[(r - sum(row) / 3) / (sum(row) / 3) for r in row] for row in R])
    a = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]), "maxrl")
    # one success in four weighs N/K = 4 over the failures' −1; GRPO's std would give 1.5, not 3
    assert a.tolist() == [[3.0, -1.0, -1.0, -1.0], [pytest.approx(1 / 3), pytest.approx(1 / 3), pytest.approx(1 / 3),
                                                     -1.0]]
    # Σ Â_i ∇logπ_i = (N/K) Σ_succ ∇logπ − Σ_all ∇logπ: the successes' advantages are N/K − 1, the failures' −1
    assert a.sum(dim=1).abs().max() < 1e-6


def test_maxrl_edge_groups():
    a = group_advantages(torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]), "maxrl")
    assert a.tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]] and torch.isfinite(a).all()  # no success: no signal, no NaN
    assert group_advantages(torch.tensor([[1.0], [0.0]]), "maxrl").tolist() == [[1.0], [0.0]]  # group of one: R_i
    assert get_objective("maxrl").config.advantage_estimator == "maxrl"


@pytest.fixture
def plugin_estimator():
    """A plugin's estimator for one test: Â_i = R_i − min_g R, with the lengths it declares it needs recorded."""
    from algorithms import register_advantage, unregister_advantage

    seen = []

    def above_min(rewards, lengths):
        seen.append(lengths)
        return rewards - rewards.min(dim=1, keepdim=True).values

    register_advantage("test-above-min", above_min, description="R − group min (test)", needs=("lengths",))
    yield seen
    unregister_advantage("test-above-min")


def test_a_registered_estimator_is_selected_by_an_objective_and_gets_what_it_declares(plugin_estimator):
    from algorithms import estimator_names

    assert "test-above-min" in estimator_names()
    obj = get_objective("grpo", advantage_estimator="test-above-min")
    assert obj.advantage_needs == ("lengths",)  # what the loops read to provide the inputs
    lengths = torch.tensor(L)
    close(obj.advantages(torch.tensor(R, dtype=torch.float64), lengths=lengths).tolist(),
          [[r - min(row) for r in row] for row in R])
    assert plugin_estimator[0] is lengths
    with pytest.raises(ValueError, match="test-above-min.*needs completion lengths"):
        obj.advantages(torch.tensor(R))


def test_a_registered_estimator_is_checked_and_names_are_unique(plugin_estimator):
    from algorithms import register_advantage, unregister_advantage

    with pytest.raises(ValueError, match="already registered"):
        register_advantage("test-above-min", lambda r: r, description="again")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("group", lambda r: r, description="a built-in's name")
    with pytest.raises(ValueError, match="'values'.*valid: lengths, greedy_rewards"):
        register_advantage("test-bad-need", lambda r, values: r, description="x", needs=("values",))
    register_advantage("test-wrong-shape", lambda r: r[:, :1], description="x")
    register_advantage("test-nan", lambda r: r * float("nan"), description="x")
    try:
        shape = r"'test-wrong-shape' \(<lambda> in .*test_advantages.py:\d+\) returned \(2, 1\), expected .*\(2, 3\)"
        with pytest.raises(ValueError, match=shape):
            group_advantages(torch.tensor(R), "test-wrong-shape")
        with pytest.raises(ValueError, match=r"'test-nan' \(<lambda> in .*\) returned a non-finite"):
            group_advantages(torch.tensor(R), "test-nan")
    finally:
        unregister_advantage("test-wrong-shape")
        unregister_advantage("test-nan")
    with pytest.raises(ValueError, match="advantage_estimator='test-wrong-shape': valid values"):
        get_objective("grpo", advantage_estimator="test-wrong-shape")  # gone with its plugin


def test_verl_refuses_a_plugin_estimator_before_any_work(plugin_estimator):
    from bench.engines.verl.losses import mapping

    p = mapping("grpo", {"advantage_estimator": "test-above-min"})
    assert p.mode == "unsupported" and "'test-above-min' has no verl counterpart" in p.reason
