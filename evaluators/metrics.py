"""Benchmark metrics over per-problem results: greedy accuracy, pass@1, unbiased pass@k, maj@k, 95% intervals.

Every metric is a mean over problems of a per-problem score. When every score is 0 or 1 (greedy accuracy, maj@k, and
pass@k whenever each problem is all right or all wrong) the mean is a binomial proportion and its interval is the
Wilson score interval, which stays honest at 0/n and n/n (a bootstrap of a constant would give [0, 0]). Fractional
scores (pass@1 over several samples, unbiased pass@k) get a percentile bootstrap over problems.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `c` correct among `n` samples (Chen et al. 2021, arXiv:2107.03374):

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

    the probability that a random size-k subset of the n samples contains a correct one (product form: no overflow).
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_correct(keys: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """maj@k of one problem: is the most frequent extracted answer (ties -> the earliest) a correct one?

    ``keys`` are grouping keys of the extracted answers (`evaluators.verify.answer_key`); samples without an answer
    (None) do not vote. A problem where no sample gave an answer counts as wrong.
    """
    if len(keys) != len(correct):
        raise ValueError(f"majority_correct: {len(keys)} keys but {len(correct)} correctness flags")
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return False
    best = max(counts.values())
    winner = next(k for k in keys if k is not None and counts[k] == best)
    return bool(correct[keys.index(winner)])


def bootstrap_ci(scores: Sequence[float], confidence: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-problem `scores` (problems resampled with replacement)."""
    x = np.asarray(scores, dtype=float)  # (P,)
    if x.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))  # (R, P)
    means = x[idx].mean(axis=1)  # (R,)
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def wilson_ci(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927): correct coverage near 0 and 1, never [0, 0].

        centre = (p + z^2 / 2n) / (1 + z^2 / n),   half-width = z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)
    """
    if n == 0:
        return (float("nan"), float("nan"))
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * float(np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends (no 1e-17 rounding residue)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def interval(scores: Sequence[float], confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean of per-problem scores: Wilson when all are 0/1 (a proportion), else bootstrap."""
    x = np.asarray(scores, dtype=float)  # (P,)
    if x.size and np.all((x == 0) | (x == 1)):
        return wilson_ci(int(x.sum()), int(x.size), confidence)
    return bootstrap_ci(scores, confidence, seed=seed)


@dataclass
class Metric:
    """A mean over problems with its 95% interval (`interval`: Wilson for proportions, else bootstrap)."""

    value: float
    ci_low: float
    ci_high: float
    n: int

    def as_dict(self) -> dict[str, float]:
        return {"value": self.value, "ci_low": self.ci_low, "ci_high": self.ci_high, "n": self.n}


def mean_with_ci(scores: Sequence[float], confidence: float = 0.95, seed: int = 0) -> Metric:
    lo, hi = interval(scores, confidence, seed=seed)
    return Metric(float(np.mean(scores)) if len(scores) else float("nan"), lo, hi, len(scores))


def summarize(greedy: Sequence[bool] | None, samples: Sequence[Sequence[bool]] | None,
              sample_keys: Sequence[Sequence[str | None]] | None, k: int, confidence: float = 0.95,
              seed: int = 0) -> dict[str, Metric]:
    """All metrics of one benchmark from per-problem results.

    ``greedy[p]``: the greedy completion of problem p is correct. ``samples[p][j]``: sample j of problem p is
    correct (n samples per problem, n >= k). ``sample_keys[p][j]``: its extracted-answer key for majority voting.
    Returns ``greedy_acc``, ``pass@1`` (mean over the n samples), ``pass@k`` (unbiased) and ``maj@k`` (first k
    samples); metrics whose inputs are absent are left out.
    """
    out: dict[str, Metric] = {}
    if greedy is not None and len(greedy):
        out["greedy_acc"] = mean_with_ci([float(g) for g in greedy], confidence, seed)
    if samples:
        n = len(samples[0])
        if any(len(s) != n for s in samples):
            raise ValueError("summarize: every problem needs the same number of samples")
        if k > n:
            raise ValueError(f"summarize: k={k} is larger than the {n} samples per problem")
        out["pass@1"] = mean_with_ci([sum(s) / n for s in samples], confidence, seed)
        if k > 1:
            out[f"pass@{k}"] = mean_with_ci([pass_at_k(n, sum(s), k) for s in samples], confidence, seed)
        if sample_keys is not None:
            out[f"maj@{k}"] = mean_with_ci([float(majority_correct(list(keys[:k]), list(s[:k])))
                                            for keys, s in zip(sample_keys, samples)], confidence, seed)
    return out
