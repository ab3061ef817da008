"""pass@k against exact enumeration, maj@k by hand, bootstrap intervals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from evaluators.metrics import bootstrap_ci, majority_correct, pass_at_k, summarize


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_equals_exact_enumeration(n):
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(samples, k))
            exact = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


def test_pass_at_k_large_n_is_stable_and_bad_input_raises():
    assert 0.0 < pass_at_k(1000, 1, 10) == pytest.approx(0.01, abs=1e-12)
    assert pass_at_k(200, 0, 100) == 0.0
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_majority_vote():
    assert majority_correct(["18", "17", "18", None], [True, False, True, False])
    assert not majority_correct(["17", "17", "18"], [False, False, True])
    assert not majority_correct(["17", "18"], [False, True])  # tie: the earliest answer wins
    assert majority_correct([None, "18", None, None], [False, True, False, False])  # no-answers do not vote
    assert not majority_correct([None, None], [False, False])


def test_bootstrap_interval():
    rng = np.random.default_rng(1)
    scores = rng.random(400) < 0.3
    lo, hi = bootstrap_ci(scores)
    assert lo < scores.mean() < hi
    assert 0.05 < hi - lo < 0.12  # ~ 2 * 1.96 * sqrt(.3 * .7 / 400) = 0.09
    assert bootstrap_ci(scores) == (lo, hi)  # seeded
    assert bootstrap_ci([1.0] * 10) == (1.0, 1.0)
    small_lo, small_hi = bootstrap_ci(scores[:40])
    assert small_hi - small_lo > hi - lo


def test_summarize():
    samples = [[True, False, False, False], [False, False, False, False], [True, True, True, False]]
    keys = [["1", "2", "2", "2"], ["5", None, "6", "7"], ["3", "3", "3", "4"]]
    m = summarize([True, False, False], samples, keys, k=4)
    assert m["greedy_acc"].value == pytest.approx(1 / 3)
    assert m["pass@1"].value == pytest.approx((1 / 4 + 0 + 3 / 4) / 3)
    assert m["pass@4"].value == pytest.approx(2 / 3)
    assert m["maj@4"].value == pytest.approx(1 / 3)
    for metric in m.values():
        assert metric.ci_low <= metric.value <= metric.ci_high and metric.n == 3
    with pytest.raises(ValueError, match="k=5 is larger"):
        summarize(None, samples, keys, k=5)


def test_wilson_interval_by_hand_and_at_the_boundaries():
    from evaluators.metrics import wilson_ci

    # 0/5: z = 1.96, upper = (z^2 / 10 + z sqrt(z^2 / 100)) / (1 + z^2 / 5) = z^2 / (5 + z^2) = 0.4345
    lo, hi = wilson_ci(0, 5)
    assert lo == 0.0 and hi == pytest.approx(1.959964 ** 2 / (5 + 1.959964 ** 2), abs=1e-6)
    lo, hi = wilson_ci(5, 5)
    assert hi == 1.0 and lo == pytest.approx(5 / (5 + 1.959964 ** 2), abs=1e-6)
    lo, hi = wilson_ci(30, 100)  # textbook value: [0.2189, 0.3958]
    assert (round(lo, 4), round(hi, 4)) == (0.2189, 0.3958)


def test_proportion_at_zero_or_one_gets_a_nonempty_interval():
    """A 0/5 greedy accuracy is not "[0.0, 0.0]": that is a bootstrap of a constant, not a binomial interval."""
    m = summarize([False] * 5, [[False, False]] * 5, [["1", "2"]] * 5, k=2)
    for name in ("greedy_acc", "pass@1", "pass@2", "maj@2"):
        assert m[name].value == 0.0 and m[name].ci_low == 0.0 and m[name].ci_high > 0.4, name
    m = summarize([True] * 5, None, None, k=1)
    assert m["greedy_acc"].ci_high == 1.0 and m["greedy_acc"].ci_low < 0.6
