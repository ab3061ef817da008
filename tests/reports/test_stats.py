"""reports/stats.py on known data: IQM, stratified-bootstrap intervals (against the exact bootstrap distribution),
probability of improvement (against scipy's Mann-Whitney U and a hand count), Holm (by hand), power (published
sample sizes, scipy's noncentral t and statsmodels); and the report's paired table equal to scipy / statsmodels."""

from __future__ import annotations

import csv
import itertools
import math

import numpy as np
import pytest
from scipy import stats

from reports import stats as S


def test_iqm_is_the_mean_of_the_middle_half():
    assert S.iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(4.5)        # mean of 3, 4, 5, 6
    assert S.iqm([0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 100.0, -50.0]) == pytest.approx(0.75)
    x = np.random.default_rng(0).normal(size=37)
    assert S.iqm(x) == pytest.approx(stats.trim_mean(x, 0.25))
    assert S.iqm([0.2, 0.4, 0.9]) == pytest.approx(0.5)                  # below 4 values nothing is trimmed


def test_positive_interval_is_the_t_interval_of_the_logs_above_0_around_the_geometric_mean():
    """Times to convergence of 2 seeds, 1.2 and 8.6 steps: the raw t interval (12.7 × s/√2) runs far below 0; the
    log-scale one is exp(mean log ± t·s/√n): above 0, asymmetric, containing the geometric mean √(1.2 × 8.6)."""
    x = [1.2, 8.6]
    m, h = S.mean_ci(x)
    assert m - h < 0                                                     # what the convergence table printed before
    est = S.positive_ci(x)
    logs = np.log(x)
    half = stats.t.ppf(0.975, 1) * np.std(logs, ddof=1) / math.sqrt(2)
    assert est.value == pytest.approx(math.sqrt(1.2 * 8.6))
    assert (est.low, est.high) == (pytest.approx(math.exp(logs.mean() - half)), pytest.approx(math.exp(logs.mean()
                                                                                                       + half)))
    assert 0 < est.low < est.value < est.high
    assert est.high - est.value > est.value - est.low                    # asymmetric: longer towards large times
    rng = np.random.default_rng(3)
    for n in (2, 3, 5, 10):
        for _ in range(200):
            v = rng.lognormal(rng.normal(0, 2), rng.uniform(0.01, 3), size=n)
            e = S.positive_ci(v)
            assert 0 < e.low <= e.value <= e.high and e.value == pytest.approx(stats.gmean(v))
    one = S.positive_ci([4.0])
    assert one.value == 4.0 and not one.has_interval
    assert S.positive_ci([3.0, 0.0]).value is None and S.positive_ci([]).value is None   # no logarithm of 0


def _exact_quantiles(strata, statistic, qs):
    """Quantiles of the exact bootstrap distribution: every resample of every stratum, equally likely."""
    per = [list(itertools.product(s, repeat=len(s))) for s in strata]
    vals = np.array(sorted(statistic(np.concatenate(combo)) for combo in itertools.product(*per)))
    return [np.quantile(vals, q) for q in qs], vals


@pytest.mark.parametrize("statistic,fn", [("mean", np.mean), ("iqm", lambda v: stats.trim_mean(v, 0.25))])
def test_stratified_bootstrap_matches_the_exact_bootstrap_distribution(statistic, fn):
    strata = [[0.61, 0.70, 0.64, 0.58], [0.30, 0.41, 0.35]]
    est = S.stratified_bootstrap(strata, statistic)
    assert est.value == pytest.approx(fn(np.concatenate(strata)))
    (lo, hi), vals = _exact_quantiles(strata, fn, [0.025, 0.975])
    # a Monte-Carlo percentile of a discrete distribution: within the atoms around the exact quantile
    atoms = np.unique(vals)
    step = np.max(np.diff(atoms))
    assert abs(est.low - lo) <= step and abs(est.high - hi) <= step
    # (resampling the pooled 7 scores instead, as an unstratified bootstrap does, gives about [0.40, 0.62] for the
    # mean: far outside this tolerance)


def test_bootstrap_needs_two_seeds_and_constant_data_gives_a_point():
    one = S.stratified_bootstrap([[0.5]])
    assert one.value == 0.5 and not one.has_interval and "2 seeds" in one.why
    same = S.stratified_bootstrap([[0.6, 0.6, 0.6]])
    assert (same.low, same.high) == (pytest.approx(0.6), pytest.approx(0.6))


def test_probability_of_improvement_by_hand_scipy_and_exact_bootstrap():
    x, y = [0.60, 0.70, 0.65], [0.50, 0.65, 0.60]
    # by hand: 0.6 beats 0.5, ties 0.6; 0.7 beats all three; 0.65 beats 0.5 and 0.6, ties 0.65 -> (6 + 2 x 0.5) / 9
    est = S.prob_improvement([x], [y])
    assert est.value == pytest.approx(7 / 9)
    assert est.value == pytest.approx(stats.mannwhitneyu(x, y).statistic / 9)
    (lo, hi), vals = _exact_quantiles([x, y], lambda v: stats.mannwhitneyu(v[:3], v[3:]).statistic / 9,
                                      [0.025, 0.975])
    step = np.max(np.diff(np.unique(vals)))
    assert abs(est.low - lo) <= step and abs(est.high - hi) <= step
    # two strata: the mean of the per-stratum probabilities
    two = S.prob_improvement([x, [0.9, 0.8]], [y, [0.1, 0.85]])
    assert two.value == pytest.approx((7 / 9 + 3 / 4) / 2)
    assert S.prob_improvement([[0.9, 0.8]], [[0.1, 0.2]]).value == 1.0


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04: x3 = 0.03, x2 = 0.06, x1 = 0.04 -> monotone 0.06
    assert S.holm([0.01, 0.04, None, 0.03]) == [pytest.approx(0.03), pytest.approx(0.06), None, pytest.approx(0.06)]
    assert S.holm([0.2]) == [pytest.approx(0.2)]
    assert S.holm([0.4, 0.5]) == [pytest.approx(0.8), pytest.approx(0.8)]
    assert S.holm([None]) == [None]


def test_holm_equals_statsmodels_and_runs_no_garbage_collection(monkeypatch):
    """Our Holm (statsmodels' runs a full garbage collection per call) against statsmodels' multipletests on random
    p-values: ties, values whose product passes 1, NaN / None among them, 1 to 9 tests. (statsmodels' collections are
    skipped here: they change no number, and 300 of them in the suite's process cost 360 s of CPU.)"""
    import gc

    from statsmodels.stats.multitest import multipletests

    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    rng = np.random.default_rng(0)
    for trial in range(300):
        m = int(rng.integers(1, 10))
        p = rng.choice([0.001, 0.01, 0.03, 0.2, 0.6], m) if trial % 3 == 0 else rng.uniform(0, 1, m) ** 3
        given: list = list(map(float, p)) + [None, float("nan")][: trial % 3]
        expected = multipletests(p, alpha=S.ALPHA, method="holm")[1]
        got = S.holm(given)
        assert got[m:] == [None] * (len(given) - m)
        assert got[:m] == pytest.approx(list(expected), abs=0, rel=1e-12), (list(p), got, expected)
    monkeypatch.undo()  # (the real gc.collect: ours must not call it)
    collections = []
    gc.callbacks.append(lambda phase, info: collections.append(info["generation"]) if phase == "start" else None)
    try:
        S.holm([0.01, 0.04, 0.03])
    finally:
        gc.callbacks.pop()
    assert 2 not in collections


def _power_nct(d: float, n: int) -> float:
    """Two-sided paired t-test power from scipy's noncentral t (independent of statsmodels)."""
    df, nc = n - 1, d * math.sqrt(n)
    crit = stats.t.ppf(1 - S.ALPHA / 2, df)
    return float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))


def test_seeds_needed_matches_published_sample_sizes_and_the_noncentral_t():
    # G*Power, paired t-test, alpha 0.05 two-sided, power 0.8: d = 0.5 -> 34 pairs, d = 1.0 -> 10, d = 0.8 -> 15
    for d, n in ((0.5, 34), (1.0, 10), (0.8, 15)):
        diffs = [d + 1, d - 1, d + 1, d - 1]           # mean d, and an SD that makes the effect size d / 1.1547
        sd = np.std(diffs, ddof=1)
        diffs = [d + (v - d) / sd for v in diffs]       # rescaled: SD 1, mean d
        pw = S.power(diffs)
        assert pw.sd_diff == pytest.approx(1.0) and pw.seeds_needed == n
        assert _power_nct(d, n) >= 0.8 > _power_nct(d, n - 1)


def test_detectable_difference_against_statsmodels_and_the_noncentral_t():
    from statsmodels.stats.power import TTestPower

    diffs = [0.012, 0.031, -0.004, 0.020, 0.009]
    pw = S.power(diffs)
    sd = np.std(diffs, ddof=1)
    want = TTestPower().solve_power(nobs=5, alpha=0.05, power=0.8, alternative="two-sided") * sd
    assert pw.detectable == pytest.approx(want)
    assert _power_nct(pw.detectable / sd, 5) == pytest.approx(0.8, abs=1e-6)
    assert pw.seeds_needed == math.ceil(TTestPower().solve_power(effect_size=np.mean(diffs) / sd, alpha=0.05,
                                                                 power=0.8))
    # a huge effect: 2 seeds (statsmodels' root finder fails there; the search does not)
    assert S.power([0.50, 0.51, 0.52]).seeds_needed == 2
    # nothing to size a test by
    assert S.power([0.1]).detectable is None and "fewer than 2" in S.power([0.1]).why
    assert S.power([0.1, 0.1, 0.1]).seeds_needed is None and "identical" in S.power([0.1, 0.1, 0.1]).why
    assert S.power([0.01, -0.01, 0.0]).seeds_text() == "> 10,000"


def test_report_paired_table_equals_scipy_and_statsmodels(handmade, local_uri, tmp_path):
    """The numbers bench report writes for three objectives x four seeds, recomputed from MLflow directly."""
    from mlflow import MlflowClient
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.power import TTestPower

    from reports.report import build_report

    handmade.log_comparison(local_uri, experiment="stats", objectives=("grpo", "tepo", "dapo"), seeds=(0, 1, 2, 3),
                            artifacts=tmp_path / "art")
    rep = build_report("stats", tracking_uri=local_uri, out_root=tmp_path / "out", figures_too=False,
                       log_artifacts=False, store_derived=False)
    client = MlflowClient(local_uri)
    final: dict[str, dict[int, float]] = {}
    for r in client.search_runs([client.get_experiment_by_name("stats").experiment_id]):
        acc = sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, "eval/accuracy"))
        final.setdefault(r.data.tags["pobench.objective"], {})[int(r.data.tags["pobench.seed"])] = acc[-1][1]
    with open(rep.out_dir / "paired_test.csv") as f:
        rows = {r["objective"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["dapo", "tepo"] and rep.baseline == "grpo"
    seeds = [0, 1, 2, 3]
    ps = {o: stats.ttest_rel([final[o][s] for s in seeds], [final["grpo"][s] for s in seeds]).pvalue
          for o in ("tepo", "dapo")}
    holm = dict(zip(ps, multipletests(list(ps.values()), method="holm")[1]))
    for o, row in rows.items():
        d = [final[o][s] - final["grpo"][s] for s in seeds]
        sd = np.std(d, ddof=1)
        assert float(row["p_value"]) == pytest.approx(ps[o])
        assert float(row["p_holm"]) == pytest.approx(holm[o])
        u = stats.mannwhitneyu([final[o][s] for s in seeds], [final["grpo"][s] for s in seeds]).statistic
        assert float(row["p_improvement"]) == pytest.approx(u / 16)
        assert float(row["detectable_diff"]) == pytest.approx(
            TTestPower().solve_power(nobs=4, alpha=0.05, power=0.8) * sd)
        # the first n at 80% power, by a linear scan of scipy's noncentral t
        assert int(row["seeds_needed"]) == next(n for n in range(2, 10_000)
                                                if _power_nct(abs(np.mean(d)) / sd, n) >= 0.8)
    with open(rep.out_dir / "aggregates.csv") as f:
        agg = {r["objective"]: r for r in csv.DictReader(f)}
    for o, v in final.items():
        assert float(agg[o]["iqm"]) == pytest.approx(stats.trim_mean(list(v.values()), 0.25))
        assert float(agg[o]["mean_low"]) <= float(agg[o]["mean"]) <= float(agg[o]["mean_high"])
