"""Derived metrics of one training run, computed from its logged MLflow series.

Every function takes plain series (a list of ``(step, value)`` pairs, sorted by step) and returns a number, or
``None`` when the quantity does not exist for that run (a target never reached, an entropy that never collapsed).
``None`` is reported as such ("not reached"), never replaced by a made-up value.

Definitions (also in ``docs/REPORTS.md``):

- smoothed accuracy: trailing mean of the last ``window`` held-out evaluations (causal, so "first step at which the
  smoothed accuracy reaches the target" never looks ahead);
- time to convergence: first evaluation step (and the wall-clock ``time/elapsed_s`` at that step) at which the
  smoothed held-out accuracy is >= the target; interpolated: the step where the straight line between that evaluation
  and the one before it crosses the target (the first evaluation's step when it is already there), and at that
  fractional step, each interpolated linearly between the whole steps around it: the completion tokens sampled so far
  (cumulative ``rollout/gen_tokens``), the training process's CPU seconds (``time/cpu_s``) and the wall-clock seconds
  (``time/elapsed_s``; they depend on the machine's load, ``load_avg`` = the mean ``sys/load_avg_1m`` of the run);
- default target: ``a0 + target_frac x (B - a0)``, where a0 is the step-0 (before training) held-out accuracy (the
  highest over the runs; they all start from the same policy, and a greedy evaluation gives them the same value) and
  B the highest point of the reference (baseline) objective's seed-mean smoothed accuracy curve: a fraction of the
  improvement the baseline actually achieves. No run meets it at step 0, the baseline's mean curve reaches it; when the
  baseline does not improve (B <= a0) there is no target;
- entropy collapse: first step at which the mean rollout entropy falls below ``frac`` x its first logged value;
- entropy blow-up: first step at which the mean rollout entropy rises above ``k`` x its first logged value (the
  other way a run falls apart: a policy that loses its skill samples near-random tokens, so its entropy rises; the
  default k = 2 mirrors the collapse's 1/2);
- accuracy collapse: first evaluation step at which the held-out accuracy falls below ``frac`` x its step-0 value
  (default: half of what the policy could do before training);
- entropy slope: least-squares slope of the mean rollout entropy against the step (nats per step);
- entropy change: the mean rollout entropy of the last 5 logged steps over that of the first 5, minus 1 (a fraction:
  −0.2 = fell by a fifth; ``relative_change``; the measure of the claims section's "less entropy collapse");
- accuracy drawdown: the largest fall of the held-out accuracy below an earlier peak, ``max_j (max_{i<=j} a_i - a_j)``;
- gradient-norm spikes: steps whose gradient norm exceeds ``k`` x the median of the previous ``window`` steps (only
  counted once at least ``min_history`` earlier steps exist);
- maximum KL: largest logged KL to the reference policy;
- reward variance: sample variance (ddof=1) of the per-step mean reward across steps;
- zero-advantage fraction: mean over steps of the fraction of groups whose rewards were all equal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from reports import metric_keys as K

Series = Sequence[tuple[int, float]]  # [(step, value)], sorted by step

# metric keys the derived quantities are read from (docs/METRICS.md)
KEY_ACC = K.EVAL_ACCURACY
KEY_ENTROPY = K.ENTROPY_MEAN
KEY_GRAD = K.GRAD_NORM
KEY_KL = K.KL_REF
KEY_REWARD = K.REWARD_MEAN
KEY_ZERO_ADV = K.ZERO_ADV_FRAC
KEY_ELAPSED = K.ELAPSED_S
KEY_CPU = K.CPU_S
KEY_TOKENS = K.GEN_TOKENS
KEY_LOAD = K.LOAD_AVG_1M


@dataclass(frozen=True)
class DerivedSettings:
    """Parameters of the derived metrics (all stated in the report)."""

    smooth_window: int = 3          # evaluations in the trailing mean of the held-out accuracy
    target_frac: float = 0.5        # default target = step-0 acc. + target_frac x the baseline's improvement over it
    collapse_frac: float = 0.5      # entropy collapse: below collapse_frac x initial entropy
    blowup_k: float = 2.0           # entropy blow-up: above blowup_k x initial entropy (the collapse's 1/2 mirrored)
    acc_collapse_frac: float = 0.5  # accuracy collapse: held-out accuracy below acc_collapse_frac x its step-0 value
    spike_k: float = 3.0            # gradient spike: above spike_k x running median
    spike_window: int = 20          # steps in the running median
    spike_min_history: int = 5      # earlier steps needed before spikes are counted


def _clean(series: Series) -> list[tuple[int, float]]:
    """Sort by step and drop non-finite values (a NaN is a missing measurement, not a value)."""
    return sorted((int(s), float(v)) for s, v in series if v is not None and math.isfinite(float(v)))


def smooth(series: Series, window: int = 3) -> list[tuple[int, float]]:
    """Trailing mean over the last ``window`` points: point j is mean(v[j-window+1 .. j])."""
    if window < 1:
        raise ValueError(f"smooth window must be >= 1, got {window}")
    pts = _clean(series)
    vals = [v for _, v in pts]
    return [(s, float(np.mean(vals[max(0, j - window + 1): j + 1]))) for j, (s, _) in enumerate(pts)]


def value_at(series: Series, step: int) -> float | None:
    """Value logged at ``step``, else the last value logged before it (``None`` if nothing precedes it)."""
    best = None
    for s, v in _clean(series):
        if s <= step:
            best = v
        else:
            break
    return best


def time_to_convergence(acc: Series, target: float, window: int = 3) -> int | None:
    """First step at which the smoothed accuracy is >= ``target``; ``None`` if it never is."""
    for s, v in smooth(acc, window):
        if v >= target - 1e-12:
            return s
    return None


def crossing(acc: Series, target: float, window: int = 3) -> tuple[float, int] | None:
    """(step, gap): where the smoothed accuracy, linearly interpolated between evaluations, first reaches
    ``target``, and the gap in steps between the two evaluations it lies between (0 when the first evaluation
    already reaches it); ``None`` if it never does."""
    sm = smooth(acc, window)
    for j, (s, v) in enumerate(sm):
        if v >= target - 1e-12:
            if j == 0:
                return float(s), 0
            s0, v0 = sm[j - 1]
            return s0 + (target - v0) / (v - v0) * (s - s0), s - s0
    return None


def seconds_at(elapsed: Series, step: float | None) -> float | None:
    """``time/elapsed_s`` at a fractional step, linear between the whole steps around it (0 s at step 0)."""
    if step is None:
        return None
    lo, hi = math.floor(step), math.ceil(step)
    a, b = seconds_at_step(elapsed, lo), seconds_at_step(elapsed, hi)
    if a is None or b is None:
        return None
    return a + (step - lo) * (b - a)


def seconds_at_step(elapsed: Series, step: int | None) -> float | None:
    """Wall-clock seconds (``time/elapsed_s``) at ``step``; step 0 (before training) is 0 s."""
    if step is None:
        return None
    if step == 0:
        return 0.0
    return value_at(elapsed, step)


def cumulative(per_step: Series) -> list[tuple[int, float]]:
    """Running total of a per-step quantity (``rollout/gen_tokens``): [(0, 0), (1, v1), (2, v1 + v2), ...], up to the
    step before the first one not logged (a total past a missing step would be too small)."""
    by_step = dict(_clean(per_step))
    out, total, step = [(0, 0.0)], 0.0, 1
    while step in by_step:
        total += by_step[step]
        out.append((step, total))
        step += 1
    return out


def at_step(cumul: Series, step: float | None) -> float | None:
    """A cumulative quantity (0 at step 0: tokens sampled, CPU seconds) at a fractional step, linear between the
    whole steps around it; ``None`` when either of them is not logged."""
    if step is None:
        return None
    by_step = {0: 0.0, **dict(_clean(cumul))}
    lo, hi = math.floor(step), math.ceil(step)
    if lo not in by_step or hi not in by_step:
        return None
    return by_step[lo] + (step - lo) * (by_step[hi] - by_step[lo])


def best_smoothed(acc: Series, window: int = 3) -> float | None:
    sm = smooth(acc, window)
    return max(v for _, v in sm) if sm else None


def entropy_collapse_step(entropy: Series, frac: float = 0.5) -> int | None:
    """First step at which entropy < ``frac`` x the first logged entropy; ``None`` if it never does."""
    pts = _clean(entropy)
    if not pts:
        return None
    threshold = frac * pts[0][1]
    for s, v in pts[1:]:
        if v < threshold:
            return s
    return None


def entropy_blowup_step(entropy: Series, k: float = 2.0) -> int | None:
    """First step at which entropy > ``k`` x the first logged entropy; ``None`` if it never does."""
    pts = _clean(entropy)
    if not pts:
        return None
    threshold = k * pts[0][1]
    for s, v in pts[1:]:
        if v > threshold:
            return s
    return None


def accuracy_collapse_step(acc: Series, frac: float = 0.5) -> int | None:
    """First evaluation step after step 0 at which the accuracy < ``frac`` x its step-0 value; ``None`` if it never
    is, or without a step-0 evaluation (nothing to fall from)."""
    pts = _clean(acc)
    if not pts or pts[0][0] != 0:
        return None
    threshold = frac * pts[0][1]
    for s, v in pts[1:]:
        if v < threshold:
            return s
    return None


def slope(series: Series) -> float | None:
    """Least-squares slope of value against step; ``None`` with fewer than two distinct steps."""
    pts = _clean(series)
    if len({s for s, _ in pts}) < 2:
        return None
    x = np.array([s for s, _ in pts], dtype=float)  # (N,)
    y = np.array([v for _, v in pts], dtype=float)  # (N,)
    return float(np.polyfit(x, y, 1)[0])


def max_drawdown(series: Series) -> float | None:
    """Largest fall below an earlier peak: max_j (max_{i<=j} v_i - v_j); 0 for a never-falling series."""
    pts = _clean(series)
    if not pts:
        return None
    peak, dd = -math.inf, 0.0
    for _, v in pts:
        peak = max(peak, v)
        dd = max(dd, peak - v)
    return float(dd)


def spike_steps(series: Series, k: float = 3.0, window: int = 20, min_history: int = 5) -> list[int]:
    """Steps whose value exceeds ``k`` x the median of the previous ``window`` values."""
    pts = _clean(series)
    out = []
    for j in range(len(pts)):
        history = [v for _, v in pts[max(0, j - window): j]]
        if len(history) >= min_history and pts[j][1] > k * float(np.median(history)):
            out.append(pts[j][0])
    return out


def series_max(series: Series) -> float | None:
    pts = _clean(series)
    return max(v for _, v in pts) if pts else None


def series_mean(series: Series) -> float | None:
    pts = _clean(series)
    return float(np.mean([v for _, v in pts])) if pts else None


def series_var(series: Series) -> float | None:
    """Sample variance (ddof=1) of the values; ``None`` with fewer than two values."""
    pts = _clean(series)
    return float(np.var([v for _, v in pts], ddof=1)) if len(pts) >= 2 else None


@dataclass
class RunDerived:
    """Every derived number of one run (``None`` = does not exist, see the module docstring)."""

    initial_acc: float | None      # held-out accuracy at step 0: the policy before training (the warm start)
    final_acc: float | None
    best_acc: float | None
    best_smoothed_acc: float | None
    target_acc: float | None       # None: the comparison has no convergence target
    ttc_step: int | None           # first evaluation step at the target
    ttc_seconds: float | None
    ttc_step_interp: float | None  # interpolated between evaluations
    ttc_seconds_interp: float | None  # wall-clock: depends on the machine's load (load_avg)
    ttc_tokens_interp: float | None   # completion tokens sampled up to the interpolated crossing
    ttc_cpu_s_interp: float | None    # the training process's CPU seconds there (None: time/cpu_s not logged)
    load_avg: float | None            # mean sys/load_avg_1m over the run's steps (None: not logged)
    ttc_gap: int | None            # steps between the two evaluations the interpolated crossing lies between
    entropy_collapse_step: int | None
    entropy_blowup_step: int | None
    acc_collapse_step: int | None  # None too without a step-0 evaluation (initial_acc None)
    entropy_slope: float | None
    entropy_change: float | None   # last 5 / first 5 logged steps of the mean rollout entropy, − 1
    acc_drawdown: float | None
    grad_spikes: int | None
    kl_max: float | None
    reward_var: float | None
    zero_adv_frac: float | None
    spike_at: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Target:
    """The default convergence target and what it is made of (stated in the report)."""

    value: float | None        # None: the reference did not improve over step 0, so there is no target
    start: float               # a0: step-0 held-out accuracy (highest over the runs)
    reference_best: float      # B: highest point of the reference's seed-mean smoothed accuracy curve
    frac: float


def mean_curve(runs: Sequence[Series], window: int = 3) -> list[tuple[int, float]]:
    """Seed-mean of the runs' smoothed accuracy at the evaluation steps every run has."""
    smoothed = [dict(smooth(a, window)) for a in runs if _clean(a)]
    if not smoothed:
        return []
    common = sorted(set.intersection(*(set(d) for d in smoothed)))
    return [(s, float(np.mean([d[s] for d in smoothed]))) for s in common]


def default_target(all_acc: Sequence[Series], reference_acc: Sequence[Series],
                   settings: DerivedSettings = DerivedSettings()) -> Target:
    """``a0 + target_frac x (B - a0)`` (module docstring); ``value`` None when B <= a0."""
    starts = [pts[0][1] for a in all_acc if (pts := _clean(a)) and pts[0][0] == 0]
    if not starts:
        raise ValueError("no run has a step-0 held-out accuracy (eval/accuracy at step 0): cannot set a convergence "
                         "target from the improvement over the starting policy; give one explicitly (--target-acc)")
    curve = mean_curve(reference_acc, settings.smooth_window)
    if not curve:
        raise ValueError("the reference objective has no held-out accuracy series (eval/accuracy): cannot set a "
                         "convergence target")
    a0, best = max(starts), max(v for _, v in curve)
    value = a0 + settings.target_frac * (best - a0) if best > a0 + 1e-12 else None
    return Target(value, a0, best, settings.target_frac)


def derive(series: Mapping[str, Series], target: float | None,
           settings: DerivedSettings = DerivedSettings()) -> RunDerived:
    """All derived metrics of one run from its series (``{metric key: [(step, value)]}``); ``target`` None: no time
    to convergence."""
    acc = series.get(KEY_ACC, [])
    acc_pts = _clean(acc)
    ttc = time_to_convergence(acc, target, settings.smooth_window) if target is not None else None
    cross = crossing(acc, target, settings.smooth_window) if target is not None else None
    spikes = spike_steps(series.get(KEY_GRAD, []), settings.spike_k, settings.spike_window,
                         settings.spike_min_history)
    return RunDerived(
        initial_acc=acc_pts[0][1] if acc_pts and acc_pts[0][0] == 0 else None,
        final_acc=acc_pts[-1][1] if acc_pts else None,
        best_acc=max(v for _, v in acc_pts) if acc_pts else None,
        best_smoothed_acc=best_smoothed(acc, settings.smooth_window),
        target_acc=None if target is None else float(target),
        ttc_step=ttc,
        ttc_seconds=seconds_at_step(series.get(KEY_ELAPSED, []), ttc),
        ttc_step_interp=cross[0] if cross else None,
        ttc_seconds_interp=seconds_at(series.get(KEY_ELAPSED, []), cross[0]) if cross else None,
        ttc_tokens_interp=at_step(cumulative(series.get(KEY_TOKENS, [])), cross[0]) if cross else None,
        ttc_cpu_s_interp=at_step(series.get(KEY_CPU, []), cross[0]) if cross else None,
        load_avg=series_mean(series.get(KEY_LOAD, [])),
        ttc_gap=cross[1] if cross else None,
        entropy_collapse_step=entropy_collapse_step(series.get(KEY_ENTROPY, []), settings.collapse_frac),
        entropy_blowup_step=entropy_blowup_step(series.get(KEY_ENTROPY, []), settings.blowup_k),
        acc_collapse_step=accuracy_collapse_step(acc, settings.acc_collapse_frac),
        entropy_slope=slope(series.get(KEY_ENTROPY, [])),
        entropy_change=relative_change(series.get(KEY_ENTROPY, []), ENTROPY_WINDOW),
        acc_drawdown=max_drawdown(acc),
        grad_spikes=len(spikes) if _clean(series.get(KEY_GRAD, [])) else None,
        kl_max=series_max(series.get(KEY_KL, [])),
        reward_var=series_var(series.get(KEY_REWARD, [])),
        zero_adv_frac=series_mean(series.get(KEY_ZERO_ADV, [])),
        spike_at=spikes,
    )


ENTROPY_WINDOW = 5  # logged steps at each end of the entropy series for its relative change (entropy_change)

# derived numbers stored back into each run as metrics `derived/<name>` (NaN + a tag when the value does not exist)
STORED = ("initial_acc", "final_acc", "best_acc", "target_acc", "ttc_step", "ttc_seconds", "ttc_step_interp",
          "ttc_seconds_interp", "ttc_tokens_interp", "ttc_cpu_s_interp", "load_avg", "entropy_collapse_step",
          "entropy_blowup_step", "acc_collapse_step", "entropy_slope", "entropy_change", "acc_drawdown", "grad_spikes",
          "kl_max", "reward_var", "zero_adv_frac")


def store(client, run_id: str, d: RunDerived, comparison: str | None = None) -> None:
    """Write the derived numbers into the run: metrics ``derived/<name>``; a missing value is logged as NaN and
    explained by the tag ``pobench.derived.<name>`` ("no target" / "not reached" / "not logged" (reached, but the run
    did not log that quantity there) / "not collapsed" / "not blown up" / "no data")."""
    import time

    from mlflow.entities import Metric, RunTag

    from reports.record import DERIVED_PREFIX, log_batch

    now = int(time.time() * 1000)
    metrics, tags = [], []
    for name in STORED:
        v = getattr(d, name)
        metrics.append(Metric(f"derived/{name}", float("nan") if v is None else float(v), now, 0))
        if name == "target_acc":
            why = "no target" if v is None else "ok"
        elif name.startswith("ttc_"):
            why = ("reached" if v is not None else "no target" if d.target_acc is None
                   else "not reached" if d.ttc_step is None else "not logged")
        elif name == "entropy_collapse_step":
            why = "not collapsed" if v is None else "collapsed"
        elif name == "entropy_blowup_step":
            why = "not blown up" if v is None else "blown up"
        elif name == "acc_collapse_step":
            why = ("no data" if d.initial_acc is None else "not collapsed") if v is None else "collapsed"
        else:
            why = "no data" if v is None else "ok"
        tags.append(RunTag(f"{DERIVED_PREFIX}{name}", why))
    if comparison:
        tags.append(RunTag(f"{DERIVED_PREFIX}comparison", comparison))
    log_batch(client, run_id, metrics=metrics, tags=tags)


def relative_change(series: Series, window: int = 5) -> float | None:
    """mean(last ``window`` values) / mean(first ``window`` values) − 1 (e.g. the entropy's change over training: −0.2
    = fell by a fifth); ``None`` with fewer than 2 × ``window`` values or a first mean of 0."""
    vals = [v for _, v in _clean(series)]
    if len(vals) < 2 * window:
        return None
    first, last = float(np.mean(vals[:window])), float(np.mean(vals[-window:]))
    return last / first - 1 if abs(first) > 1e-12 else None
