"""Statistics of a comparison over seeds, from scipy and statsmodels.

- ``mean_ci``: mean and 95% Student-t half-width over seeds (``scipy.stats.t``);
- ``positive_ci``: for a positive quantity (a time to convergence, a ratio of two): the geometric mean over seeds
  with the 95% Student-t interval of the mean of the logarithms, exponentiated: ``exp(m ± t(0.975, n-1)·s/√n)``
  with m, s the mean and SD of ``log x``. Asymmetric, always above 0, and it contains the geometric mean (a t interval
  on the raw values of a skewed positive quantity runs below 0 with few seeds);
- ``iqm``: interquartile mean, the mean of the middle 50% of the scores (``scipy.stats.trim_mean(x, 0.25)``, as
  rliable's IQM, Agarwal et al. 2021, arXiv 2108.13264); with fewer than 4 scores nothing is trimmed (it is the mean);
- ``stratified_bootstrap``: a stratified-bootstrap percentile interval: every stratum (a benchmark; the seeds of one
  objective on one task are one stratum) is resampled with replacement on its own, the statistic is computed on the
  pooled resample (``scipy.stats.bootstrap`` with one sample per stratum, which resamples each independently);
- ``prob_improvement``: P(X > Y) of an objective X over the baseline Y, the Mann-Whitney U statistic over all pairs of
  their scores divided by n·m (ties count one half; ``scipy.stats.mannwhitneyu``), averaged over strata, with a
  stratified-bootstrap interval resampling both objectives' seeds (rliable's "probability of improvement");
- ``holm``: Holm's step-down correction of several p-values against one baseline (the numbers of
  ``statsmodels.stats.multitest.multipletests(method="holm")``, tested against it; computed here because that
  function runs a full garbage collection on every call);
- ``power``: for a paired t-test over n seeds at two-sided alpha 0.05 and 80% power (scipy's noncentral t, the
  computation of ``statsmodels.stats.power.TTestPower``; tested against it and against published sample sizes),
  taking the observed standard deviation of the per-seed differences as the truth: the smallest mean difference those
  n seeds could detect, and the number of seeds needed to detect the observed mean difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.8
N_RESAMPLES = 20_000
MAX_SEEDS = 10_000  # "more than this many seeds" is said instead of a number (a difference of about zero)


def mean_ci(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, 95% Student-t CI half-width) of the values; half-width ``None`` with fewer than two values."""
    v = [float(x) for x in values]
    if not v:
        return None, None
    m = float(np.mean(v))
    if len(v) < 2:
        return m, None
    from scipy import stats

    return m, float(stats.t.ppf(0.5 + CONFIDENCE / 2, len(v) - 1) * np.std(v, ddof=1) / math.sqrt(len(v)))


def positive_ci(values: Sequence[float]) -> Estimate:
    """Geometric mean of positive values with the 95% interval ``exp(m ± t(0.975, n-1)·s/√n)`` (m, s: mean and SD of
    their logarithms), as an :class:`Estimate`; no interval with one value, no value when one is not above 0."""
    from scipy import stats

    v = np.asarray([float(x) for x in values], dtype=float)
    if not len(v):
        return Estimate(None, why="no values")
    if not np.all(np.isfinite(v)) or np.any(v <= 0):
        return Estimate(None, why="a value not above 0 (no logarithm)")
    logs = np.log(v)
    m = float(logs.mean())
    if len(v) < 2:
        return Estimate(math.exp(m), why="1 seed")
    h = float(stats.t.ppf(0.5 + CONFIDENCE / 2, len(v) - 1) * logs.std(ddof=1) / math.sqrt(len(v)))
    return Estimate(math.exp(m), math.exp(m - h), math.exp(m + h))


def iqm(values, axis: int | None = None):
    """Interquartile mean: ``scipy.stats.trim_mean(values, 0.25)`` (the mean of the middle half)."""
    from scipy import stats

    return stats.trim_mean(values, 0.25, axis=axis)


def _pooled_mean(*strata, axis=-1):
    return np.mean(np.concatenate(strata, axis=axis), axis=axis)


def _pooled_iqm(*strata, axis=-1):
    return iqm(np.concatenate(strata, axis=axis), axis=axis)


STATISTICS = {"mean": _pooled_mean, "iqm": _pooled_iqm}


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its stratified-bootstrap interval (``low``/``high`` None when it has none)."""

    value: float | None
    low: float | None = None
    high: float | None = None
    why: str = ""            # why there is no interval (or no value)

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None


def _bootstrap(samples: tuple, statistic, seed: int) -> tuple[float, float] | None:
    from scipy import stats

    if any(len(s) < 2 for s in samples):
        return None
    res = stats.bootstrap(samples, statistic, n_resamples=N_RESAMPLES, confidence_level=CONFIDENCE,
                          method="percentile", vectorized=True, axis=-1, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def stratified_bootstrap(strata: Sequence[Sequence[float]], statistic: str = "mean", seed: int = 0) -> Estimate:
    """``statistic`` ("mean" | "iqm") of the pooled scores with its stratified-bootstrap 95% percentile interval."""
    samples = tuple(np.asarray(s, dtype=float) for s in strata if len(s))
    if not samples:
        return Estimate(None, why="no scores")
    fn = STATISTICS[statistic]
    value = float(fn(*[s[None, :] for s in samples])[0])
    ci = _bootstrap(samples, fn, seed)
    if ci is None:
        return Estimate(value, why="fewer than 2 seeds")
    return Estimate(value, *ci)


def _poi(*samples, axis=-1):
    """Mean over strata of P(X > Y) + P(X = Y)/2; ``samples`` = (x_1, y_1, x_2, y_2, ...), last axis = scores."""
    out = []
    for x, y in zip(samples[0::2], samples[1::2]):
        gt = (x[..., :, None] > y[..., None, :]).mean(axis=(-1, -2))
        eq = (x[..., :, None] == y[..., None, :]).mean(axis=(-1, -2))
        out.append(gt + 0.5 * eq)
    return np.mean(out, axis=0)


def prob_improvement(x_strata: Sequence[Sequence[float]], y_strata: Sequence[Sequence[float]],
                     seed: int = 0) -> Estimate:
    """P(X > Y) averaged over strata (stratum i of x against stratum i of y), with a stratified-bootstrap interval."""
    from scipy import stats

    pairs = [(np.asarray(x, float), np.asarray(y, float)) for x, y in zip(x_strata, y_strata) if len(x) and len(y)]
    if not pairs:
        return Estimate(None, why="no scores")
    value = float(np.mean([stats.mannwhitneyu(x, y).statistic / (len(x) * len(y)) for x, y in pairs]))
    samples = tuple(a for p in pairs for a in p)
    ci = _bootstrap(samples, _poi, seed)
    if ci is None:
        return Estimate(value, why="fewer than 2 seeds")
    return Estimate(value, *ci)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-corrected p-values (None and NaN stay None and are not counted as tests): with the m p-values sorted, the
    k-th smallest (k from 0) times m - k, made non-decreasing from the smallest up, at most 1 (Holm 1979). The numbers
    of statsmodels' ``multipletests(method="holm")``, which tests/reports/test_stats.py compares with it; not that
    function itself, because it runs a full garbage collection on every call: 0.3-0.4 CPU-seconds in a process that
    holds torch and transformers (a `bench run` that reports, a notebook), one or two per report."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)), key=lambda i: pvalues[i])
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for k, i in enumerate(idx):
        running = max(running, min(1.0, float(pvalues[i]) * (len(idx) - k)))
        out[i] = running
    return out


@dataclass(frozen=True)
class Power:
    """What a paired t-test over ``n`` seeds can detect, from the observed SD of the per-seed differences."""

    n: int
    mean_diff: float | None
    sd_diff: float | None
    detectable: float | None      # smallest |mean difference| detected with probability POWER at ALPHA (two-sided)
    seeds_needed: int | None      # seeds to detect the observed mean difference with probability POWER
    why: str = ""                 # why a number is missing

    def seeds_text(self) -> str:
        if self.seeds_needed is None:
            return "n/a" if not self.why else f"n/a ({self.why})"
        return f"> {MAX_SEEDS:,}" if self.seeds_needed > MAX_SEEDS else str(self.seeds_needed)


def paired_power(effect: float, n: int, alpha: float = ALPHA) -> float:
    """Power of a two-sided paired t-test over ``n`` seeds at standardised effect ``effect`` (mean / SD of the
    differences): P(|T'| > t_{1-alpha/2, n-1}) with T' noncentral t (df n-1, noncentrality effect·√n), from scipy.
    (statsmodels' TTestPower gives the same numbers but NaN at moderate noncentrality, e.g. effect 4 with 4 seeds.)"""
    from scipy import stats

    df, nc = n - 1, effect * math.sqrt(n)
    crit = stats.t.ppf(1 - alpha / 2, df)
    lower = float(stats.nct.cdf(-crit, df, nc))
    if not math.isfinite(lower) and nc >= 8:  # scipy's nct fails far out in this tail, which is < Φ(−8) < 1e-15 there
        lower = 0.0
    return float(stats.nct.sf(crit, df, nc)) + lower


def power(diffs: Sequence[float]) -> Power:
    """Detectable difference and seeds needed for the paired differences ``diffs`` (objective − baseline per seed)."""
    from scipy.optimize import brentq

    d = np.asarray(diffs, dtype=float)
    n = len(d)
    if n < 2:
        return Power(n, float(d.mean()) if n else None, None, None, None, "fewer than 2 paired seeds")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd <= 1e-12:
        return Power(n, mean, sd, None, None, "identical differences at every seed: no variance to size a test by")
    # the standardised effect these n seeds detect with probability POWER (power grows with the effect)
    detectable = brentq(lambda e: paired_power(e, n) - POWER, 1e-9, 1e4, xtol=1e-12) * sd
    if abs(mean) <= 1e-12:
        return Power(n, mean, sd, detectable, MAX_SEEDS + 1, "")
    effect = abs(mean) / sd

    def enough(k: int) -> bool:
        return paired_power(effect, k) >= POWER

    # the first number of seeds at POWER (power grows with n): doubling from 2, then bisection
    lo, hi = 1, 2  # one seed tests nothing
    while not enough(hi):
        if hi > MAX_SEEDS:
            return Power(n, mean, sd, detectable, MAX_SEEDS + 1, "")
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return Power(n, mean, sd, detectable, hi, "")
