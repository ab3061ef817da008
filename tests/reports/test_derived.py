"""Derived metrics on hand-made series: convergence (reached / never reached), entropy collapse, stability."""

import math

import pytest

from reports import derived as D


def test_smooth_is_trailing_mean():
    s = [(0, 0.0), (10, 0.3), (20, 0.6), (30, 0.9)]
    assert D.smooth(s, 3) == [(0, 0.0), (10, 0.15), (20, pytest.approx(0.3)), (30, pytest.approx(0.6))]
    assert D.smooth(s, 1) == s
    with pytest.raises(ValueError, match="window"):
        D.smooth(s, 0)


def test_time_to_convergence_first_step_reaching_target():
    acc = [(0, 0.1), (10, 0.5), (20, 0.7), (30, 0.8), (40, 0.8)]
    # smoothed (w=2): 0.1, 0.3, 0.6, 0.75, 0.8
    assert D.time_to_convergence(acc, 0.75, window=2) == 30
    assert D.time_to_convergence(acc, 0.6, window=2) == 20
    assert D.time_to_convergence(acc, 0.1, window=2) == 0


def test_time_to_convergence_never_reached_is_none_not_imputed():
    acc = [(0, 0.1), (10, 0.2), (20, 0.3)]
    assert D.time_to_convergence(acc, 0.5) is None
    d = D.derive({D.KEY_ACC: acc, D.KEY_ELAPSED: [(10, 5.0), (20, 9.0)]}, target=0.5)
    assert d.ttc_step is None and d.ttc_seconds is None


def test_seconds_at_convergence_uses_elapsed_at_that_step():
    elapsed = [(1, 1.5), (2, 3.0), (10, 15.0), (20, 31.0)]
    assert D.seconds_at_step(elapsed, 10) == 15.0
    assert D.seconds_at_step(elapsed, 0) == 0.0
    assert D.seconds_at_step(elapsed, 15) == 15.0      # last logged before the step
    assert D.seconds_at_step(elapsed, None) is None


def test_convergence_in_tokens_and_cpu_seconds_is_each_read_at_the_interpolated_crossing():
    """Accuracy 0.3 at step 5 and 0.7 at step 10 cross 0.5 at step 7.5. There: the cumulative tokens (steps 1..7 and
    1..8 of 100 + 10 s per step: 980 and 1160) interpolated to 1070; the CPU seconds (0.3 s² per step count) between
    14.7 and 19.2: 16.95; the wall-clock seconds (2 s per step): 15. Each from its own series, none from another's."""
    series = {D.KEY_ACC: [(0, 0.1), (5, 0.3), (10, 0.7)],
              D.KEY_TOKENS: [(s, 100.0 + 10 * s) for s in range(1, 11)],
              D.KEY_CPU: [(s, 0.3 * s * s) for s in range(1, 11)],
              D.KEY_ELAPSED: [(s, 2.0 * s) for s in range(1, 11)],
              D.KEY_LOAD: [(s, 1.5 + (s % 2)) for s in range(1, 11)]}
    d = D.derive(series, target=0.5, settings=D.DerivedSettings(smooth_window=1))
    assert d.ttc_step_interp == pytest.approx(7.5) and d.ttc_step == 10
    assert d.ttc_tokens_interp == pytest.approx(1070.0)
    assert d.ttc_cpu_s_interp == pytest.approx(16.95)
    assert d.ttc_seconds_interp == pytest.approx(15.0)
    assert d.load_avg == pytest.approx(2.0)
    assert D.cumulative([(1, 5.0), (2, 7.0), (4, 1.0)]) == [(0, 0.0), (1, 5.0), (2, 12.0)]  # stops at a missing step
    # a quantity not logged at the steps around the crossing is None, never a value read from another step: tokens
    # with a gap; CPU seconds only up to step 7 (a run resumed from a checkpoint written before time/cpu_s), or none
    # (a verl run)
    gap = {**series, D.KEY_TOKENS: [(s, 100.0) for s in range(1, 11) if s != 3],
           D.KEY_CPU: [(s, 0.3 * s * s) for s in range(1, 8)]}
    d2 = D.derive(gap, target=0.5, settings=D.DerivedSettings(smooth_window=1))
    assert d2.ttc_tokens_interp is None and d2.ttc_cpu_s_interp is None and d2.ttc_step_interp == pytest.approx(7.5)
    del gap[D.KEY_CPU]
    assert D.derive(gap, target=0.5, settings=D.DerivedSettings(smooth_window=1)).ttc_cpu_s_interp is None
    assert D.at_step([(1, 4.0), (2, 6.0)], 0.5) == pytest.approx(2.0)   # 0 at step 0


def test_default_target_is_a_fraction_of_the_baselines_improvement_over_step0():
    base = [[(0, 0.5), (10, 0.5), (20, 0.8)], [(0, 0.5), (10, 0.7), (20, 0.8)]]  # smoothed w=3: .5,.5,.6 / .5,.6,.6667
    other = [(0, 0.5), (10, 0.9), (20, 0.95)]                                    # a faster objective
    t = D.default_target(base + [other], base)        # the defaults: trailing 3 evaluations, half the improvement
    best = (0.6 + 2.0 / 3) / 2                                                   # top of the seed-mean curve
    assert (t.start, t.reference_best) == (0.5, pytest.approx(best))
    assert t.value == pytest.approx(0.5 + 0.5 * (best - 0.5))
    # nobody meets it at step 0; the baseline's seed-mean curve (and here each seed) reaches it
    for acc in base + [other]:
        assert D.time_to_convergence(acc, t.value, 3) != 0
    assert D.time_to_convergence(other, t.value, 3) == 10
    assert D.time_to_convergence(base[0], t.value, 3) == 20
    assert D.time_to_convergence(base[1], t.value, 3) == 10
    # step 0 is the highest starting accuracy of any run
    assert D.default_target([[(0, 0.55), (10, 0.6)]] + base, base).start == 0.55
    # a baseline that never improves gives no target; no step 0 or no baseline series is an error
    assert D.default_target(base, [[(0, 0.5), (10, 0.4), (20, 0.5)]]).value is None
    with pytest.raises(ValueError, match="step-0"):
        D.default_target([[(10, 0.5)]], base)
    with pytest.raises(ValueError, match="eval/accuracy"):
        D.default_target(base, [[], []])


def test_entropy_collapse_at_step_k():
    ent = [(s, 2.0 * (0.9 ** s)) for s in range(30)]  # halves after log(0.5)/log(0.9) = 6.58 steps
    assert D.entropy_collapse_step(ent, 0.5) == 7
    assert D.entropy_collapse_step([(s, 2.0 - 0.01 * s) for s in range(30)], 0.5) is None
    assert D.entropy_collapse_step([], 0.5) is None


def test_entropy_blowup_at_step_k():
    """The other way a run falls apart: the entropy rises (a policy that lost its skill samples near-random tokens)."""
    ent = [(s, 0.4 * (1.1 ** (s - 1))) for s in range(1, 30)]  # doubles after log(2)/log(1.1) = 7.27 steps
    assert D.entropy_blowup_step(ent, 2.0) == 9                   # 0.4 x 1.1^8 = 0.857 > 0.8; step 8: 0.779
    assert D.entropy_blowup_step(ent, 3.0) == 13
    assert D.entropy_blowup_step([(1, 0.4), (2, 0.8)], 2.0) is None            # exactly 2x is not above it
    assert D.entropy_blowup_step([(s, 2.0 * 0.9 ** s) for s in range(30)], 2.0) is None   # a collapse is not one
    assert D.entropy_collapse_step(ent, 0.5) is None                           # nor is a blow-up a collapse
    assert D.entropy_blowup_step([], 2.0) is None


def test_accuracy_collapse_against_step_0():
    """A pilot run fell from 61% to 0.2%: the first evaluation below half its step-0 accuracy."""
    acc = [(0, 0.61), (2, 0.63), (4, 0.40), (6, 0.30), (8, 0.002)]
    assert D.accuracy_collapse_step(acc, 0.5) == 6               # 0.30 < 0.305; 0.40 is not
    assert D.accuracy_collapse_step(acc, 0.7) == 4
    assert D.accuracy_collapse_step([(0, 0.61), (2, 0.305)], 0.5) is None      # exactly half is not below it
    assert D.accuracy_collapse_step([(2, 0.61), (4, 0.0)], 0.5) is None        # no step 0: nothing to fall from
    assert D.accuracy_collapse_step(acc[:3], 0.5) is None
    d = D.derive({D.KEY_ACC: acc, D.KEY_ENTROPY: [(1, 0.3), (3, 0.35), (5, 0.9), (7, 2.5)]}, target=None)
    assert (d.acc_collapse_step, d.entropy_blowup_step, d.entropy_collapse_step) == (6, 5, None)
    assert d.acc_drawdown == pytest.approx(0.628)
    d = D.derive({D.KEY_ACC: acc, D.KEY_ENTROPY: [(1, 0.3), (3, 0.61)]}, target=None,
                 settings=D.DerivedSettings(blowup_k=3.0, acc_collapse_frac=0.01))
    assert (d.acc_collapse_step, d.entropy_blowup_step) == (8, None)


def test_entropy_slope_and_drawdown():
    assert D.slope([(s, 3.0 - 0.25 * s) for s in range(10)]) == pytest.approx(-0.25)
    assert D.slope([(0, 1.0)]) is None
    acc = [(0, 0.2), (10, 0.6), (20, 0.3), (30, 0.5), (40, 0.45), (50, 0.7), (60, 0.65)]
    assert D.max_drawdown(acc) == pytest.approx(0.3)   # 0.6 -> 0.3
    assert D.max_drawdown([(0, 0.1), (1, 0.2)]) == 0.0


def test_grad_spikes_against_running_median():
    g = [(s, 1.0) for s in range(10)] + [(10, 3.5), (11, 1.0), (12, 2.9), (13, 10.0)]
    assert D.spike_steps(g, k=3.0, window=20, min_history=5) == [10, 13]
    # no spike counted before min_history earlier steps exist
    assert D.spike_steps([(0, 1.0), (1, 100.0)], k=3.0, min_history=5) == []


def test_nan_values_are_missing_measurements():
    assert D.series_max([(0, 0.1), (1, float("nan")), (2, 0.3)]) == 0.3
    assert D.series_var([(0, 1.0), (1, 3.0)]) == pytest.approx(2.0)
    assert D.series_var([(0, 1.0)]) is None


def test_derive_all_fields():
    series = {
        D.KEY_ACC: [(0, 0.1), (5, 0.5), (10, 0.6)],
        D.KEY_ELAPSED: [(s, 2.0 * s) for s in range(1, 11)],
        D.KEY_ENTROPY: [(s, 1.0 - 0.08 * s) for s in range(1, 11)],
        D.KEY_GRAD: [(s, 1.0) for s in range(1, 11)],
        D.KEY_KL: [(s, 0.01 * s) for s in range(1, 11)],
        D.KEY_REWARD: [(s, 0.1 * s) for s in range(1, 11)],
        D.KEY_ZERO_ADV: [(s, 0.5) for s in range(1, 11)],
    }
    d = D.derive(series, target=0.4, settings=D.DerivedSettings(smooth_window=2))
    assert (d.initial_acc, d.final_acc, d.best_acc) == (0.1, 0.6, 0.6)
    assert D.derive({D.KEY_ACC: [(5, 0.5)]}, target=0.4).initial_acc is None   # no step-0 evaluation
    assert d.ttc_step == 10 and d.ttc_seconds == 20.0   # smoothed: 0.1, 0.3, 0.55
    assert d.entropy_collapse_step == 7                  # 1 - 0.56 = 0.44 < 0.5 * 0.92
    assert d.entropy_blowup_step is None and d.acc_collapse_step is None
    assert d.entropy_slope == pytest.approx(-0.08)
    # mean of steps 6-10 over steps 1-5: (1 − 0.08·8) / (1 − 0.08·3) − 1
    assert d.entropy_change == pytest.approx((1 - 0.64) / (1 - 0.24) - 1)
    assert D.derive({D.KEY_ENTROPY: [(s, 1.0) for s in range(1, 10)]}, target=None).entropy_change is None  # < 10
    assert d.grad_spikes == 0 and d.kl_max == pytest.approx(0.1)
    assert d.reward_var == pytest.approx(math.fsum((0.1 * s - 0.55) ** 2 for s in range(1, 11)) / 9)
    assert d.zero_adv_frac == 0.5
