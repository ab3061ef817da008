"""The tables of a comparison's report, built from the derived numbers of its runs (reports/derived.py).

Each builder takes ``groups`` (objective -> [(seed, RunDerived)] in the comparison's order) and returns a
:class:`reports.tables.Table`. Statistics over seeds come from reports/stats.py; definitions: docs/REPORTS.md.
"""

from __future__ import annotations

import math
import re

import numpy as np

from reports import checks, stats
from reports import metric_keys as K
from reports.derived import ENTROPY_WINDOW, DerivedSettings, RunDerived
from reports.tables import Table, Units, fmt, fmt_mean_ci, fmt_p, paired_test, pm

Groups = dict[str, list[tuple[int, RunDerived]]]


def _vals(rows, attr) -> list:
    return [getattr(d, attr) for d in rows if getattr(d, attr) is not None]


def finals(groups: Groups) -> dict[str, dict[int, float]]:
    """objective -> {seed: final held-out accuracy} (seeds without one left out)."""
    return {o: {s: d.final_acc for s, d in rs if d.final_acc is not None} for o, rs in groups.items()}


def accuracy_table(groups: Groups, units: Units) -> Table:
    rows, csv_rows, cols = [], [], {2: [], 3: [], 4: [], 5: []}
    for obj, rs in groups.items():
        ds = [d for _, d in rs]
        gains = [d.final_acc - d.initial_acc for d in ds if d.final_acc is not None and d.initial_acc is not None]
        values = [_vals(ds, "initial_acc"), _vals(ds, "final_acc"), _vals(ds, "best_acc"), gains]
        cis = [stats.mean_ci(v) if len(v) == len(ds) else (None, None) for v in values]
        cells = [units.acc_ci(*ci) for ci in cis[:3]]
        m, h = cis[3]
        cells.append("n/a" if m is None else (units.diff(m) + (f" ± {units.acc(h)}" if h is not None else "")))
        rows.append([obj, str(len(ds)), *cells])
        csv_rows.append([obj, len(ds), *[x for ci in cis for x in ci]])
        for j, ci in zip((2, 3, 4, 5), cis):
            cols[j].append(ci[0])
    t = Table("accuracy", "Held-out accuracy",
              f"Greedy held-out accuracy ({units.unit}) before training (step 0: the warm-start policy), at the last "
              f"evaluation (final) and the highest over evaluations (best); gain = final − step 0 per seed "
              f"({units.diff_unit}). Mean ± 95% Student-t CI over n seeds. Bold: the highest mean of a column (not "
              "a significance statement; see the paired comparison).",
              ["objective", "n", "step 0", "final", "best", "gain over step 0"], rows,
              ["objective", "n", "initial_mean", "initial_ci95", "final_mean", "final_ci95", "best_mean",
               "best_ci95", "gain_mean", "gain_ci95"], csv_rows)
    for j in (3, 4, 5):
        t.emphasise(j, cols[j], "max")
    return t


def aggregates_table(groups: Groups, units: Units) -> Table:
    """Mean and interquartile mean of the final accuracy over seeds, each with a stratified-bootstrap 95% interval."""
    rows, csv_rows, means, iqms = [], [], [], []
    for obj, rs in groups.items():
        vals = [d.final_acc for _, d in rs if d.final_acc is not None]
        est = [stats.stratified_bootstrap([vals], s) for s in ("mean", "iqm")]
        rows.append([obj, str(len(vals)), *[f"{units.acc(e.value)} {units.interval(e.low, e.high)}" for e in est]])
        csv_rows.append([obj, len(vals), *[x for e in est for x in (e.value, e.low, e.high)]])
        means.append(est[0].value)
        iqms.append(est[1].value)
    t = Table("aggregates", "Final accuracy: mean and interquartile mean",
              f"Final greedy held-out accuracy ({units.unit}) over seeds: mean and interquartile mean (IQM, the mean "
              f"of the middle 50% of seeds; equal to the mean below 4 seeds), each with a {stats.N_RESAMPLES:,}-sample "
              "stratified-bootstrap 95% percentile interval [low, high] (seeds resampled with replacement; "
              "scipy.stats.bootstrap). n/a: fewer than 2 seeds. With few seeds a percentile bootstrap interval is "
              "too narrow (it never leaves the range of the seeds' values): the t interval of the accuracy table is "
              "the conservative one.",
              ["objective", "n", "mean [95% CI]", "IQM [95% CI]"], rows,
              ["objective", "n", "mean", "mean_low", "mean_high", "iqm", "iqm_low", "iqm_high"], csv_rows)
    t.emphasise(2, means, "max")
    t.emphasise(3, iqms, "max")
    return t


def paired_rows(groups: Groups, baseline: str | None) -> list[dict]:
    """Per objective other than the baseline: paired t-test, probability of improvement, power, Holm p-value."""
    if baseline not in groups:
        return []
    fin = finals(groups)
    base = fin[baseline]
    out = []
    for obj in groups:
        if obj == baseline:
            continue
        pt = paired_test(fin[obj], base)
        common = sorted(set(fin[obj]) & set(base))
        poi = stats.prob_improvement([list(fin[obj].values())], [list(base.values())])
        pw = stats.power([fin[obj][s] - base[s] for s in common])
        out.append({"objective": obj, "test": pt, "poi": poi, "power": pw})
    for r, p in zip(out, stats.holm([r["test"].p for r in out])):
        r["p_holm"] = p
    return out


def paired_table(prs: list[dict], baseline: str | None, units: Units) -> Table:
    rows, csv_rows = [], []
    for r in prs:
        pt, poi, pw = r["test"], r["poi"], r["power"]
        rows.append([r["objective"], baseline, str(pt.n), units.diff(pt.mean_diff),
                     f"{fmt(poi.value, 2)} " + (f"[{fmt(poi.low, 2)}, {fmt(poi.high, 2)}]" if poi.has_interval
                                                else "n/a"),
                     fmt(pt.t, 2), pt.note or fmt_p(pt.p), fmt_p(r["p_holm"]) if r["p_holm"] is not None else "n/a",
                     units.acc(pw.detectable) if pw.detectable is not None else "n/a", pw.seeds_text()])
        csv_rows.append([r["objective"], baseline, pt.n, pt.mean_diff, poi.value, poi.low, poi.high, pt.t, pt.p,
                         r["p_holm"], pw.sd_diff, pw.detectable, pw.seeds_needed, pt.note or pw.why])
    m = sum(r["p_holm"] is not None for r in prs)
    caption = (f"Each objective against {baseline or 'the baseline'} on per-seed final held-out accuracy over the n "
               f"seeds both ran. diff = mean(objective − baseline) ({units.diff_unit}). P(improvement) = P(objective's "
               "final accuracy > the baseline's) over all pairs of their seeds, ties counting one half (the "
               "Mann-Whitney U statistic / n·m), with a stratified-bootstrap 95% interval. t, p: paired t-test "
               f"(scipy.stats.ttest_rel); p (Holm): Holm-corrected over the {m} objective{'s' if m != 1 else ''} "
               "compared with the baseline (statsmodels). Detectable: the smallest mean difference a paired t-test "
               "over these n seeds detects with 80% power at two-sided α = 0.05, taking the observed seed SD of the "
               f"differences as the truth ({units.diff_unit}); seeds needed: to detect the observed difference the "
               "same way (power from the noncentral t, as statsmodels' TTestPower).")
    return Table("paired_test", f"Against the baseline ({baseline or 'none'})", caption,
                 ["objective", "baseline", "n", "diff", "P(improvement) [95% CI]", "t", "p", "p (Holm)",
                  "detectable diff", "seeds needed"], rows,
                 ["objective", "baseline", "n", "mean_diff", "p_improvement", "p_improvement_low",
                  "p_improvement_high", "t", "p_value", "p_holm", "sd_diff", "detectable_diff", "seeds_needed",
                  "note"], csv_rows)


def power_note(groups: Groups, best: str, others: list[str], units: Units) -> str:
    """What the seeds could detect between ``best`` and each of ``others`` (the objectives no ranking separates from
    it) and how many seeds their observed differences would need: paired t-test over common seeds, alpha 0.05
    two-sided, 80% power, the observed SD of the per-seed differences taken as the truth. Each difference is written
    out as "other − best", the way round of the paired table (objective − baseline) when ``best`` is the baseline."""
    fin = finals(groups)
    parts, unsized = [], {}
    for o in others:
        common = sorted(set(fin[best]) & set(fin[o]))
        pw = stats.power([fin[o][s] - fin[best][s] for s in common])
        diff = f"{o} − {best} = {units.diff(pw.mean_diff)}"
        if pw.detectable is None:
            unsized.setdefault(f"{pw.why}; observed difference {diff} {units.diff_unit}"
                               if pw.mean_diff is not None else pw.why, []).append(o)
            continue
        parts.append(f"{o} (observed {diff}, detectable with {pw.n} seeds {units.acc(pw.detectable)}, seeds needed "
                     f"{pw.seeds_text()})")
    text = ""
    if parts:
        text = (f"To separate {best} from each at 80% power (paired t-test, α = 0.05, observed seed SD of the "
                f"differences, {units.diff_unit}): " + "; ".join(parts) + ".")
    for why, objs in unsized.items():
        text += (" " if text else "") + f"No power statement for {best} against {', '.join(objs)}: {why}."
    return text


# the units of time to convergence: (key, RunDerived attribute at the interpolated crossing, column title)
TTC_UNITS = (("steps", "ttc_step_interp", "steps"), ("tokens", "ttc_tokens_interp", "tokens"),
             ("cpu_s", "ttc_cpu_s_interp", "CPU s"))


def convergence_rows(groups: Groups, baseline: str | None) -> list[dict]:
    """Interpolated time to convergence per objective in steps, sampled tokens and CPU seconds: each the geometric
    mean over seeds with its positive 95% interval (``stats.positive_ci``; ``None`` unless every seed reached the
    target, and an estimate without value naming the seeds that did not log the quantity), and the geometric mean of
    its per-seed ratios to the baseline; ``load``: the runs' mean machine load (wall-clock seconds are per run only)."""
    by_seed = {obj: dict(rs) for obj, rs in groups.items()}
    base = by_seed.get(baseline) if baseline else None
    out = []
    for obj, rs in groups.items():
        ds = [d for _, d in rs]
        reached = len(_vals(ds, "ttc_step_interp"))
        r = {"objective": obj, "n": len(ds), "reached": reached}
        for unit, attr, _ in TTC_UNITS:
            vals = _vals(ds, attr)
            r[f"{unit}_per_seed"] = [getattr(d, attr) for d in ds]
            if reached < len(ds):
                r[unit] = None
            elif len(vals) < len(ds):
                r[unit] = stats.Estimate(None, why=f"not logged by {len(ds) - len(vals)}/{len(ds)} seeds")
            else:
                r[unit] = stats.positive_ci(vals)
            ratios = []
            for seed, d in by_seed[obj].items():
                b = base.get(seed) if base else None
                num, den = getattr(d, attr), getattr(b, attr) if b is not None else None
                if num is not None and den:
                    ratios.append(num / den)
            r[f"{unit}_ratio"] = stats.positive_ci(ratios) if base is not None and len(ratios) == len(ds) else None
        loads = _vals(ds, "load_avg")
        r["load"] = float(np.mean(loads)) if loads else None
        out.append(r)
    return out


def amount(x: float | None, thousands: bool = False) -> str:
    """A positive amount (steps, tokens, seconds, a ratio of two) to 3 significant digits, so an interval's bound near
    0 is not printed "0.0": 0.000686, 16.9, 1234, 15.3k, 2.41M (``thousands``: 1.23k from 1,000 on, else from
    10,000)."""
    if x is None:
        return "n/a"
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(x) >= (div if thousands or div > 1e3 else 1e4):
            v = x / div
            return f"{v:.{max(0, 2 - math.floor(math.log10(abs(v))))}f}{suffix}"
    return fmt(x, 0) if abs(x) >= 100 else f"{x:#.3g}"


def estimate_cell(e: stats.Estimate | None, text) -> str:
    """``value [low, high]`` of an estimate (``text`` formats a number); ``n/a (why)`` without a value."""
    if e is None or e.value is None:
        return "n/a" + (f" ({e.why})" if e is not None and e.why else "")
    return text(e.value) + (f" [{text(e.low)}, {text(e.high)}]" if e.has_interval else "")


def convergence_table(conv: list[dict], target_text: str, interval: str, baseline: str | None) -> Table:
    rows, csv_rows = [], []
    for r in conv:
        cells = []
        for unit, _, _ in TTC_UNITS:
            cells.append(estimate_cell(r[unit], amount) if r[unit] is not None else "not reached")
        if r["reached"] < r["n"]:
            reached = ", ".join(fmt(s, 1) for s in r["steps_per_seed"] if s is not None)
            cells[0] = (f"not reached by {r['n'] - r['reached']}/{r['n']} seeds" +
                        (f" (others: {reached})" if reached else ""))
        ratio = [estimate_cell(r[f"{u}_ratio"], amount) if r["objective"] != baseline else "baseline"
                 for u, _, _ in TTC_UNITS]
        rows.append([r["objective"], str(r["n"]), f"{r['reached']}/{r['n']}", *cells, *ratio])
        crow = [r["objective"], r["n"], r["reached"]]
        for key in [u for u, _, _ in TTC_UNITS] + [f"{u}_ratio" for u, _, _ in TTC_UNITS]:
            e = r[key]
            crow += [e.value, e.low, e.high] if e is not None else [None, None, None]
        csv_rows.append(crow)
    base = f"ratio to {baseline}" if baseline else "ratio to baseline"
    t = Table("convergence", "Time to convergence",
              f"Training steps, completion tokens sampled (cumulative rollout/gen_tokens: the same for a seed and "
              f"configuration on any machine) and CPU seconds of the training process (time/cpu_s: its own steps' "
              f"CPU time, which other jobs on the machine do not add to) until the smoothed held-out accuracy "
              f"reaches the target, {target_text}: at the crossing interpolated linearly between the two evaluations "
              f"around it ({interval}). Geometric mean over seeds [95% interval: the Student-t interval of the mean "
              f"of the logarithms, exponentiated; asymmetric and above 0], given only when every seed reached the "
              f"target. Ratio = the objective's time / the baseline's at the same seed: geometric mean of the "
              f"per-seed ratios [the same interval on the log ratios] (below 1: faster than the baseline). "
              f"Wall-clock seconds are not compared here: runs that share a machine measure its load as much as "
              f"the objective; each run's is in runs.csv (ttc_seconds_interp) with the machine's mean load while it "
              f"trained (load_avg). The first evaluation step at or above the target is in runs.csv (ttc_step). "
              f"Bold: the shortest time.",
              ["objective", "n", "reached", *[f"{title} [95% CI]" for _, _, title in TTC_UNITS],
               *[f"{title} {base}" for _, _, title in TTC_UNITS]], rows,
              ["objective", "n", "reached",
               *[f"{u}_{c}" for u, _, _ in TTC_UNITS for c in ("gmean", "low95", "high95")],
               *[f"{u}_ratio_{c}" for u, _, _ in TTC_UNITS for c in ("gmean", "low95", "high95")]], csv_rows)
    for j, (unit, _, _) in enumerate(TTC_UNITS, start=3):
        t.emphasise(j, [r[unit].value if r[unit] is not None else None for r in conv], "min")
    return t


# the stability table: when each way a run can fall apart began (attribute, column), then summaries over the steps
# (attribute, column, digits; None: an accuracy difference, in the report's units)
ONSETS = [("entropy_collapse_step", "entropy collapse"), ("entropy_blowup_step", "entropy blow-up"),
          ("acc_collapse_step", "acc. collapse")]
STAB = [("acc_drawdown", "acc. drawdown", None), ("entropy_change", "entropy change", 3),
        ("entropy_slope", "entropy slope /step", 5),
        ("grad_spikes", "grad-norm spikes", 1), ("kl_max", "max KL", 4), ("reward_var", "reward var.", 4),
        ("zero_adv_frac", "zero-adv. frac.", 3)]


def onset_cell(steps: list, n: int) -> str:
    """When a failure began over ``n`` seeds (``steps``: the step of each seed where it happened): "none (0/3)", the
    mean step ± 95% CI when every seed had it ("7.0 ± 1.2 (3/3)"), else each seed's step ("2/3 seeds: step 5, 7")."""
    if not steps:
        return f"none (0/{n})"
    if len(steps) == n:
        return fmt_mean_ci(steps, 1) + f" ({n}/{n})"
    return f"{len(steps)}/{n} seeds: step " + ", ".join(str(c) for c in steps)


def stability_table(groups: Groups, s: DerivedSettings, units: Units) -> Table:
    rows, csv_rows = [], []
    for obj, rs in groups.items():
        ds = [d for _, d in rs]
        row, crow = [obj, str(len(ds))], [obj, len(ds)]
        for attr, _ in ONSETS:
            steps = _vals(ds, attr)
            row.append(onset_cell(steps, len(ds)))
            crow += [len(steps), *stats.mean_ci(steps)]
        for attr, _, digits in STAB:
            v = _vals(ds, attr)
            ci = stats.mean_ci(v) if len(v) == len(ds) else (None, None)
            if len(v) < len(ds):
                row.append(f"n/a ({len(ds) - len(v)} seeds lack data)")
            else:
                row.append(units.acc_ci(*ci) if digits is None else pm(*ci, digits))
            crow.extend(ci)
        rows.append(row)
        csv_rows.append(crow)
    csv_cols = ["objective", "n"]
    for attr, _ in ONSETS:
        name = attr.removesuffix("_step")
        csv_cols += [f"{name}_seeds", f"{attr}_mean", f"{attr}_ci95"]
    for attr, _, _ in STAB:
        csv_cols += [f"{attr}_mean", f"{attr}_ci95"]
    caption = (f"When a run began to fall apart, either way: entropy collapse (first step with mean rollout entropy "
               f"< {s.collapse_frac:g} × its initial value), entropy blow-up (first step with mean rollout entropy > "
               f"{s.blowup_k:g} × its initial value: a policy that lost its skill samples near-random tokens), "
               f"accuracy collapse (first evaluation with held-out accuracy < {s.acc_collapse_frac:g} × its step-0 "
               f"value); each as the mean step ± 95% CI (k/n: the seeds where it happened), or the step of each seed "
               f"where only some had it. Drawdown: largest fall of held-out accuracy below an earlier peak "
               f"({units.diff_unit}). Entropy change: mean rollout entropy of the last {ENTROPY_WINDOW} logged steps / "
               f"the first {ENTROPY_WINDOW}, − 1 (a fraction; −0.2 = fell by a fifth). Slope: least-squares entropy "
               f"change per step (nats). Spikes: steps with gradient norm > {s.spike_k:g} × the median of the "
               f"previous {s.spike_window}. Max KL to the reference policy; "
               f"variance of the per-step mean reward across steps; mean fraction of groups with all-equal rewards. "
               f"Mean ± 95% CI over seeds.")
    t = Table("stability", "Stability", caption,
              ["objective", "n", *[t for _, t in ONSETS], *[t for _, t, _ in STAB]], rows, csv_cols, csv_rows)
    t.breaks = (t.columns.index(STAB[2][1]),)  # wider than a page: the onsets and how far a run fell, then the rest
    return t


RUN_COLS = ["initial_acc", "final_acc", "best_acc", "ttc_step", "ttc_step_interp", "ttc_seconds_interp",
            "ttc_seconds"]
STAB_COLS = [a for a, _ in ONSETS] + [a for a, _, _ in STAB]
# runs.csv's time to convergence in the load-independent units, and the load the wall-clock seconds ran under
CONV_COLS = ["ttc_tokens_interp", "ttc_cpu_s_interp", "load_avg"]


def _wall_clock(seconds: float | None, load: float | None) -> str:
    """Wall-clock seconds never without the load they ran under."""
    return f"{fmt(seconds, 1)} (load {'not logged' if load is None else fmt(load, 1)})"


def runs_tables(cmp, derived: dict[str, RunDerived], units: Units) -> tuple[Table, Table]:
    """Per-run numbers, split in two so neither is wider than a page: accuracy and convergence; stability.
    ``runs.csv`` holds every column of both."""
    acc_rows, stab_rows, csv_rows, stab_csv = [], [], [], []
    for r in cmp.runs:
        d = derived[r.run_id]
        vals = [getattr(d, c) for c in RUN_COLS]
        stab_vals = [getattr(d, c) for c in STAB_COLS]
        n_problems = r.params.get("eval_problems", "")
        lo, hi = checks.final_acc_interval(d.final_acc, int(n_problems) if n_problems.isdigit() else None)
        no_ttc = "no target" if d.target_acc is None else "not reached"
        at_ttc = [fmt(d.ttc_step_interp, 1), amount(d.ttc_tokens_interp) if d.ttc_tokens_interp is not None else
                  "not logged", amount(d.ttc_cpu_s_interp) if d.ttc_cpu_s_interp is not None else "not logged",
                  _wall_clock(d.ttc_seconds_interp, d.load_avg) if d.ttc_seconds_interp is not None else
                  "not logged"]
        acc_rows.append([r.variant, str(r.seed), units.acc(d.initial_acc), units.acc(d.final_acc),
                         units.interval(lo, hi), units.acc(d.best_acc),
                         no_ttc if d.ttc_step is None else str(d.ttc_step),
                         *([no_ttc] * len(at_ttc) if d.ttc_step_interp is None else at_ttc)])
        onsets = ["none" if getattr(d, a) is None else str(getattr(d, a)) for a, _ in ONSETS]
        stab_rows.append([r.variant, str(r.seed), *onsets, units.acc(d.acc_drawdown), fmt(d.entropy_change, 3),
                          fmt(d.entropy_slope, 5),
                          fmt(d.grad_spikes), fmt(d.kl_max, 4), fmt(d.reward_var, 4), fmt(d.zero_adv_frac, 3)])
        csv_rows.append([r.run_id, r.name, r.variant, r.seed, *vals, *[getattr(d, c) for c in CONV_COLS], *stab_vals,
                         lo, hi])
        stab_csv.append([r.run_id, r.variant, r.seed, *stab_vals])
    runs = Table("runs", "Per-run accuracy and convergence",
                 f"The per-objective tables are means over these per-run values. Accuracy in {units.unit}; final 95%: "
                 "Wilson interval of the run's final held-out accuracy as a proportion of its eval_problems problems "
                 "(n/a when the run did not log eval_problems). Time to convergence: first evaluation step at the "
                 "target; at the crossing interpolated between evaluations: the step, the completion tokens sampled, "
                 "the training process's CPU seconds, and the wall-clock seconds with the machine's mean 1-minute "
                 "load average while the run trained (wall-clock seconds measure that load as much as the objective; "
                 "compare objectives by steps, tokens or CPU seconds).",
                 ["objective", "seed", "step 0", "final", "final 95%", "best", "ttc eval step", "ttc step",
                  "ttc tokens", "ttc CPU s", "ttc wall-clock s (load)"], acc_rows,
                 ["run_id", "run", "objective", "seed", *RUN_COLS, *CONV_COLS, *STAB_COLS, "final_acc_ci95_low",
                  "final_acc_ci95_high"], csv_rows)
    stab = Table("runs_stability", "Per-run stability",
                 f"Per-run values behind the stability table (definitions there; the step where each failure began, "
                 f"none: it did not; drawdown in {units.diff_unit}).",
                 ["objective", "seed", *[t for _, t in ONSETS], *[t for _, t, _ in STAB]], stab_rows,
                 ["run_id", "objective", "seed", *STAB_COLS], stab_csv)
    return runs, stab


def summary_key(template: str, objective: str) -> str:
    """``template`` (``summary/{objective}/...``) for one objective label, written with the characters MLflow takes
    in a key: ``+`` of a variant and anything else becomes ``_``, and a leading dot too, so no label (one read back
    from a store included) makes a key that names another path (``summary/../x``)."""
    name = re.sub(r"[^\w\-.]", "_", objective)
    return template.format(objective="_" + name[1:] if name.startswith(".") else name)


def summary_metrics(groups: Groups, paired: list[dict]) -> dict[str, float]:
    """The headline numbers a comparison's own MLflow run carries (``summary/<objective>/...``): each objective's
    seed-mean final accuracy and, against the baseline, the mean paired gain, its Holm p-value and the probability of
    improvement. Objective names are written with MLflow's allowed characters (:func:`summary_key`)."""
    out = {summary_key(K.SUMMARY_FINAL_ACC, o): float(np.mean(list(v.values())))
           for o, v in finals(groups).items() if v}
    for r in paired:
        values = {K.SUMMARY_GAIN: r["test"].mean_diff, K.SUMMARY_P_HOLM: r.get("p_holm"), K.SUMMARY_POI: r["poi"].value}
        out.update({summary_key(t, r["objective"]): float(v) for t, v in values.items() if v is not None and v == v})
    return out
