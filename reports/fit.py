"""The compute-performance fit of ScaleRL (Khatri et al. 2025, "The Art of Scaling Reinforcement Learning Compute for
LLMs", arXiv 2510.13786): held-out accuracy R against training compute C follows a sigmoid

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

with A the asymptotic accuracy (the ceiling), B the scaling exponent (how sharply it rises: efficiency), C_mid the
compute at which half of the gain A - R0 is reached (efficiency), and R0 the step-0 accuracy (measured, not fitted).

Compute C is the completion tokens sampled so far (cumulative ``rollout/gen_tokens``): the same for a seed and
configuration on any machine and under any load. It is a proxy for FLOPs that leaves out prompt tokens and the
scoring and update passes (an objective that needs a reference pass or more update epochs costs more per token).

Per objective, one fit on the (C, R) points of all its seeds' evaluations after step 0 (``scipy.optimize.curve_fit``
in log C, bounds 0 <= A <= 1, 0 < B <= ``B_MAX``, C_mid within ``C_MID_RANGE`` x the compute range), and 95%
intervals of A, B and C_mid from a bootstrap over seeds (seeds resampled with replacement, all the points of each
resampled seed refitted; ``N_RESAMPLES`` resamples from a fixed random seed): the fit ± t(0.975, n - 1) x the refits'
standard deviation, on the log scale for B and C_mid (``bootstrap_intervals``). When no fit can be made the result
says why: too few evaluations, no step-0 accuracy, sampled tokens not logged, no improvement over step 0 (a sigmoid
rising to a ceiling describes nothing about an objective that gets worse), curve_fit failing.

What it can and cannot say (docs/REPORTS.md): disjoint intervals of A mean different ceilings, of B or C_mid different
efficiency, within the compute run; an A whose C_mid lies beyond the largest compute measured is an extrapolation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from reports import metric_keys as K
from reports.checks import MIN_SEEDS_TO_RANK
from reports.derived import cumulative
from reports.sections import amount
from reports.tables import Table, Units, fmt

N_RESAMPLES = 1000          # bootstrap resamples of the seeds
RESAMPLE_SEED = 0           # the random seed of the resampling (a report is reproducible)
MIN_POINTS = 4              # distinct compute values after step 0 needed to fit 3 parameters
B_MAX = 20.0                # the steepest rise fitted (B = 20: from 10% to 90% of the gain within a factor 1.25 of C)
C_MID_RANGE = 100.0         # C_mid is fitted within [smallest C / 100, largest C x 100]
MIN_FITTED = 0.9            # fewer resamples fitted than this fraction: no interval


class FitError(ValueError):
    """No fit: the message says why (shown in the report)."""


@dataclass(frozen=True)
class Sigmoid:
    """R(C) = r0 + (a - r0) / (1 + (c_mid / C)^b)."""

    r0: float
    a: float
    b: float
    c_mid: float

    def __call__(self, c) -> np.ndarray:
        from scipy.special import expit

        c = np.asarray(c, dtype=float)
        return self.r0 + (self.a - self.r0) * expit(self.b * (np.log(c) - math.log(self.c_mid)))


@dataclass(frozen=True)
class ComputeFit:
    """One objective's fit (``curve`` None: ``why`` says why) and its bootstrap intervals (None: ``why_ci``)."""

    objective: str
    seeds: int
    points: list[tuple[float, float]]                # (compute, held-out accuracy) of every seed after step 0
    r0: float | None
    curve: Sigmoid | None = None
    rmse: float | None = None                        # root mean square residual of the fit (accuracy)
    a_ci: tuple[float, float] | None = None
    b_ci: tuple[float, float] | None = None
    c_mid_ci: tuple[float, float] | None = None
    fitted: int = 0                                  # bootstrap resamples fitted (of N_RESAMPLES)
    efficiency_identified: bool = True               # False: the rise is a step or before the data (B, C_mid)
    why: str = ""                                    # why there is no fit
    why_ci: str = ""                                 # why there is no interval
    notes: list[str] = field(default_factory=list)   # e.g. C_mid beyond the compute measured

    @property
    def extrapolated(self) -> bool:
        """C_mid beyond the largest compute measured: the ceiling A is not observed, only extrapolated."""
        return self.curve is not None and self.curve.c_mid > max(c for c, _ in self.points)


def fit_sigmoid(points: Sequence[tuple[float, float]], r0: float, start: Sigmoid | None = None) -> Sigmoid:
    """Least-squares fit of A, B and C_mid to ``points`` [(C > 0, R)] with R0 = ``r0`` fixed (in log C); the best
    of a few starting points (``start`` first, when given). FitError when none converges."""
    from scipy.optimize import curve_fit
    from scipy.special import expit

    c = np.array([p[0] for p in points], dtype=float)  # (N,)
    r = np.array([p[1] for p in points], dtype=float)  # (N,)
    if np.any(c <= 0) or not np.all(np.isfinite(c)) or not np.all(np.isfinite(r)):
        raise FitError("compute must be positive and finite")
    if len(np.unique(c)) < MIN_POINTS:
        raise FitError(f"too few evaluations ({len(np.unique(c))} after step 0; {MIN_POINTS} needed)")
    x = np.log(c)

    def model(x, a, b, log_c_mid):
        return r0 + (a - r0) * expit(b * (x - log_c_mid))

    lo = [0.0, 1e-3, x.min() - math.log(C_MID_RANGE)]
    hi = [1.0, B_MAX, x.max() + math.log(C_MID_RANGE)]
    a0 = float(np.clip(r.max(), 1e-3, 1 - 1e-3))
    starts = [(a0, b0, float(np.quantile(x, q))) for b0 in (1.0, 3.0) for q in (0.25, 0.5, 0.75)]
    if start is not None:
        starts.insert(0, (start.a, start.b, math.log(start.c_mid)))
    best, best_sse = None, math.inf
    for p0 in starts:
        p0 = [float(np.clip(v, lo_ + 1e-9, hi_ - 1e-9)) for v, lo_, hi_ in zip(p0, lo, hi)]
        try:
            p, _ = curve_fit(model, x, r, p0=p0, bounds=(lo, hi), max_nfev=2000)
        except (RuntimeError, ValueError):
            continue
        sse = float(np.sum((model(x, *p) - r) ** 2))
        if sse < best_sse - 1e-15:
            best, best_sse = p, sse
        if start is not None and best is not None:
            break  # a bootstrap refit from the full fit's parameters: one start is enough when it converges
    if best is None:
        raise FitError("curve_fit did not converge")
    return Sigmoid(r0, float(best[0]), float(best[1]), float(math.exp(best[2])))


def run_points(series: dict) -> list[tuple[float, float]]:
    """(completion tokens sampled up to the step, held-out accuracy) at each evaluation after step 0; FitError when
    the tokens of a step before an evaluation were not logged."""
    tokens = dict(cumulative(series.get(K.GEN_TOKENS, [])))
    out = []
    for step, acc in sorted(series.get(K.EVAL_ACCURACY, [])):
        if step == 0 or acc is None or not math.isfinite(acc):
            continue
        if step not in tokens:
            raise FitError(f"sampled tokens ({K.GEN_TOKENS}) not logged at every step")
        out.append((tokens[step], float(acc)))
    return out


def _gain(per_seed: Sequence[Sequence[tuple[float, float]]], r0: float) -> float:
    """Mean over seeds of the last evaluation's accuracy (at the largest compute), minus R0."""
    return float(np.mean([max(pts, key=lambda p: p[0])[1] for pts in per_seed])) - r0


def fit_objective(objective: str, per_seed: Sequence[Sequence[tuple[float, float]]], r0: float | None,
                  n_resamples: int = N_RESAMPLES, seed: int = RESAMPLE_SEED) -> ComputeFit:
    """The fit over every seed's points (``per_seed``: one list of (C, R) per seed) and its bootstrap over seeds."""
    per_seed = [list(p) for p in per_seed if p]
    points = [p for pts in per_seed for p in pts]
    base = ComputeFit(objective, len(per_seed), points, r0)
    if r0 is None:
        return _with(base, why="no step-0 accuracy (R0)")
    if not per_seed:
        return _with(base, why="no evaluation after step 0")
    gain = _gain(per_seed, r0)
    if gain <= 0:
        return _with(base, why="no improvement to fit (mean final accuracy at or below step 0)")
    try:
        curve = fit_sigmoid(points, r0)
    except FitError as e:
        return _with(base, why=str(e))
    if curve.a <= r0:
        return _with(base, why="no improvement to fit (the fitted ceiling is below the step-0 accuracy)")
    resid = np.array([r for _, r in points]) - curve([c for c, _ in points])
    notes = []
    if curve.b >= B_MAX * (1 - 1e-3):
        notes.append(f"B at bound {B_MAX:g}")
    if curve.c_mid < min(c for c, _ in points):
        notes.append("C_mid before data")
    identified = not notes  # a step, or a rise before the first evaluation: no B or C_mid in the data
    if curve.c_mid > max(c for c, _ in points):
        notes.append("A extrapolated")
    if curve.a >= 1 - 1e-6:
        notes.append("A at bound 1")
    fit = _with(base, curve=curve, rmse=float(np.sqrt(np.mean(resid ** 2))), notes=notes,
                efficiency_identified=identified)
    if len(per_seed) < 2:
        return _with(fit, why_ci="1 seed")
    rng = np.random.default_rng(seed)
    cache: dict[tuple[int, ...], Sigmoid | None] = {}
    params = []
    for _ in range(n_resamples):
        idx = tuple(sorted(rng.integers(0, len(per_seed), len(per_seed)).tolist()))
        if idx not in cache:  # (the same multiset of seeds is the same refit: few seeds have few distinct resamples)
            try:
                cache[idx] = fit_sigmoid([p for i in idx for p in per_seed[i]], r0, start=curve)
            except FitError:
                cache[idx] = None
        if cache[idx] is not None:
            params.append((cache[idx].a, cache[idx].b, cache[idx].c_mid))
    if len(params) < MIN_FITTED * n_resamples:
        return _with(fit, fitted=len(params), why_ci=f"only {len(params)}/{n_resamples} bootstrap resamples fitted")
    a_ci, b_ci, c_mid_ci = bootstrap_intervals(curve, np.array(params), len(per_seed))
    if not identified:
        b_ci = c_mid_ci = None
    return _with(fit, fitted=len(params), a_ci=a_ci, b_ci=b_ci, c_mid_ci=c_mid_ci)


def bootstrap_intervals(curve: Sigmoid, params: np.ndarray, n_seeds: int) -> tuple[tuple[float, float], ...]:
    """95% intervals of A, B and C_mid from the refits of the resampled seeds (``params`` (R, 3): a, b, c_mid):
    the fit ± t(0.975, n_seeds - 1) x the refits' standard deviation, for A within [0, 1] and for B and C_mid on the
    log scale (positive, asymmetric). The t quantile widens the interval for few seeds, where a percentile interval
    of a bootstrap over seeds is too narrow (measured on synthetic curves, docs/REPORTS.md)."""
    from scipy import stats

    t = float(stats.t.ppf(0.975, n_seeds - 1))
    sd_a = float(params[:, 0].std(ddof=1))
    a_ci = (max(0.0, curve.a - t * sd_a), min(1.0, curve.a + t * sd_a))
    sd_log = np.log(params[:, 1:]).std(axis=0, ddof=1)  # (2,)
    b_ci, c_mid_ci = ((float(math.exp(math.log(v) - t * sd)), float(math.exp(math.log(v) + t * sd)))
                      for v, sd in zip((curve.b, curve.c_mid), sd_log))
    return a_ci, b_ci, c_mid_ci


def _with(fit: ComputeFit, **changes) -> ComputeFit:
    from dataclasses import replace

    return replace(fit, **changes)


def compute_fits(cmp, n_resamples: int = N_RESAMPLES) -> dict[str, ComputeFit]:
    """objective -> its fit, in the comparison's order (R0: the mean step-0 accuracy of its seeds)."""
    out = {}
    for obj in cmp.objectives:
        runs = [r for r in cmp.runs if r.variant == obj]
        starts = [v for r in runs for s, v in r.series.get(K.EVAL_ACCURACY, []) if s == 0]
        r0 = float(np.mean(starts)) if starts else None
        try:
            per_seed = [run_points(r.series) for r in runs]
        except FitError as e:
            out[obj] = ComputeFit(obj, len(runs), [], r0, why=str(e))
            continue
        out[obj] = fit_objective(obj, per_seed, r0, n_resamples)
    return out


def _disjoint(x: tuple[float, float] | None, y: tuple[float, float] | None) -> bool:
    return x is not None and y is not None and (x[1] < y[0] or y[1] < x[0])


def verdicts(fits: dict[str, ComputeFit], baseline: str | None, min_seeds: int = MIN_SEEDS_TO_RANK) -> list[str]:
    """For each objective against the baseline, one sentence: they differ in ceiling (A intervals disjoint), in
    efficiency (B or C_mid intervals disjoint), both, or neither is resolved; or why nothing can be said."""
    base = fits.get(baseline) if baseline else None
    if base is None:
        return []
    out = []
    for obj, f in fits.items():
        if obj == baseline:
            continue
        missing = [(o, g) for o, g in ((obj, f), (baseline, base)) if g.curve is None]
        if missing:
            out.append(f"{obj} against {baseline}: no statement ({'; '.join(f'{o}: {g.why}' for o, g in missing)}).")
            continue
        few = min(f.seeds, base.seeds)
        if few < min_seeds:
            out.append(f"{obj} against {baseline}: no statement ({few} seed(s); fewer than {min_seeds} seeds give a "
                       f"bootstrap over seeds too few distinct resamples).")
            continue
        no_ci = [(o, g) for o, g in ((obj, f), (baseline, base)) if g.a_ci is None]
        if no_ci:
            out.append(f"{obj} against {baseline}: no statement (no interval: "
                       f"{'; '.join(f'{o}: {g.why_ci}' for o, g in no_ci)}).")
            continue
        ceiling = _disjoint(f.a_ci, base.a_ci)
        efficiency = [n for n, a, b in (("B", f.b_ci, base.b_ci), ("C_mid", f.c_mid_ci, base.c_mid_ci))
                      if _disjoint(a, b)]
        unidentified = [f"{o}: {g.notes[0]}" for o, g in ((obj, f), (baseline, base)) if not g.efficiency_identified]
        if unidentified:
            what = (("differ in ceiling (A intervals disjoint)" if ceiling else "ceiling (A) not resolved") +
                    f"; efficiency (B, C_mid) not identified ({'; '.join(unidentified)})")
        elif ceiling and efficiency:
            what = f"differ in ceiling (A) and in efficiency ({' and '.join(efficiency)})"
        elif ceiling:
            what = "differ in ceiling (A intervals disjoint); efficiency (B, C_mid) not resolved"
        elif efficiency:
            what = f"differ in efficiency ({' and '.join(efficiency)} intervals disjoint); ceiling (A) not resolved"
        else:
            what = "neither ceiling nor efficiency resolved (the intervals of A, B and C_mid overlap)"
        extra = [o for o, g in ((obj, f), (baseline, base)) if g.extrapolated]
        out.append(f"{obj} against {baseline}: {what}" +
                   (f"; A of {' and '.join(extra)} extrapolated beyond the compute run" if extra else "") + ".")
    return out


def fit_table(fits: dict[str, ComputeFit], units: Units) -> Table:
    """The ``compute_fit`` table: R0, A, B and C_mid with their bootstrap intervals per objective, or why not."""
    rows, csv_rows = [], []
    for f in fits.values():
        c = f.curve
        if c is None:
            cells = ["n/a"] * 4
        else:
            def ci(x, text):
                return f" [{text(x[0])}, {text(x[1])}]" if x is not None else ""

            cells = [units.acc(c.a) + ci(f.a_ci, units.acc), fmt(c.b, 2) + ci(f.b_ci, lambda v: fmt(v, 2)),
                     amount(c.c_mid, True) + ci(f.c_mid_ci, lambda v: amount(v, True)), units.acc(f.rmse)]
        note = f.why or "; ".join([*f.notes, *([f"no interval: {f.why_ci}"] if f.why_ci else [])]) or "–"
        rows.append([f.objective, str(f.seeds), str(len(f.points)), units.acc(f.r0), *cells, note])
        ci_of = [x or (None, None) for x in (f.a_ci, f.b_ci, f.c_mid_ci)]
        csv_rows.append([f.objective, f.seeds, len(f.points), f.r0,
                         *(x for v, (lo, hi) in zip((c.a, c.b, c.c_mid) if c else (None,) * 3, ci_of)
                           for x in (v, lo, hi)), f.rmse, f.fitted, f.why or "; ".join(f.notes) or f.why_ci])
    caption = (f"Held-out accuracy R against compute C fitted per objective with ScaleRL's sigmoid (arXiv "
               f"2510.13786), R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B): R0 the step-0 accuracy (measured), A the "
               f"asymptotic accuracy (ceiling), B the scaling exponent and C_mid the compute at half the gain "
               f"(efficiency). C = completion tokens sampled so far (cumulative rollout/gen_tokens: the same for a "
               f"seed and configuration on any machine; prompt, scoring and update passes not counted). One "
               f"least-squares fit (scipy.optimize.curve_fit, in log C; 0 ≤ A ≤ 1, 0 < B ≤ {B_MAX:g}) on every "
               f"evaluation after step 0 of all seeds; [95% interval]: bootstrap over seeds ({N_RESAMPLES:,} "
               f"resamples of the seeds with replacement, each refitted; fixed random seed): the fit ± t(0.975, "
               f"n − 1) × the refits' standard deviation (log scale for B and C_mid), still somewhat narrow with few "
               f"seeds. "
               f"Accuracies and RMSE (root mean square residual) in {units.unit}. Notes: A extrapolated = C_mid "
               f"lies beyond the largest compute measured, so the ceiling is not in the data; A at bound 1 = the "
               f"data show no ceiling below 100%; B at bound {B_MAX:g} (a step) or C_mid before data (the rise lies "
               f"before the first evaluation) = B and C_mid are not identified: no interval and no efficiency "
               f"statement.")
    return Table("compute_fit", "Compute-performance fit (sigmoid in sampled tokens)", caption,
                 ["objective", "seeds", "points", "R0", "A [95% CI]", "B [95% CI]", "C_mid tokens [95% CI]", "RMSE",
                  "note"], rows,
                 ["objective", "seeds", "points", "r0", "a", "a_low95", "a_high95", "b", "b_low95", "b_high95",
                  "c_mid", "c_mid_low95", "c_mid_high95", "rmse", "resamples_fitted", "note"], csv_rows)
