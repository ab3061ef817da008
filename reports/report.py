"""`bench report`: build a comparison's figures, tables and one-page ``report.md`` from MLflow alone.

``build_report`` loads the comparison's finished runs (``reports.load``), derives convergence and stability metrics
(``reports.derived``), stores them back into each run (``derived/<name>`` metrics), writes everything into
``reports/out/<experiment>/`` and logs that folder as artifacts (``report/``) of the comparison's MLflow run
(``pobench.kind=comparison``, created if absent).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from reports import checks, figures
from reports import metric_keys as K
from reports.derived import KEY_ACC, DerivedSettings, RunDerived, default_target, derive, store
from reports.load import Comparison, load_comparison
from reports.record import COMPARISON, CONFIG_HASH, KIND, STOPPED
from reports.tables import Table, fmt, fmt_mean_ci, mean_ci, paired_test

DEFAULT_BASELINE = "grpo"
PARAMS_SHOWN = ("model", "task", "eval_task", "steps", "prompts_per_step", "group_size", "max_new_tokens", "lr",
                "eval_every", "eval_problems", "backend")


@dataclass
class Report:
    out_dir: Path
    comparison: Comparison
    target_acc: float
    baseline: str | None
    derived: dict[str, RunDerived]                   # run_id -> derived numbers
    tables: dict[str, Table] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    artifact_run_id: str | None = None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "experiment"


def _vals(rows, attr) -> list:
    return [getattr(d, attr) for d in rows if getattr(d, attr) is not None]


def _group(cmp: Comparison, derived: dict[str, RunDerived]) -> dict[str, list[tuple[int, RunDerived]]]:
    out: dict[str, list[tuple[int, RunDerived]]] = {o: [] for o in cmp.objectives}
    for r in cmp.runs:
        out[r.variant].append((r.seed, derived[r.run_id]))
    return out


def accuracy_table(groups) -> Table:
    rows, csv_rows = [], []
    for obj, rs in groups.items():
        ds = [d for _, d in rs]
        gains = [d.final_acc - d.initial_acc for d in ds if d.final_acc is not None and d.initial_acc is not None]
        cols = [_vals(ds, "initial_acc"), _vals(ds, "final_acc"), _vals(ds, "best_acc"), gains]
        rows.append([obj, str(len(ds)), *[fmt_mean_ci(v) if len(v) == len(ds) else "n/a" for v in cols]])
        csv_rows.append([obj, len(ds), *[x for v in cols for x in (mean_ci(v) if len(v) == len(ds) else
                                                                    (None, None))]])
    return Table("accuracy", "Held-out accuracy", "Greedy held-out accuracy before training (step 0: the warm-start "
                 "policy), at the last evaluation (final) and the highest over evaluations (best); gain = final - "
                 "step 0 per seed. Mean ± 95% Student-t CI over n seeds.",
                 ["objective", "n", "step 0", "final accuracy", "best accuracy", "gain over step 0"], rows,
                 ["objective", "n", "initial_mean", "initial_ci95", "final_mean", "final_ci95", "best_mean",
                  "best_ci95", "gain_mean", "gain_ci95"], csv_rows)


def convergence_rows(groups, baseline: str | None) -> list[dict]:
    out = []
    for obj, rs in groups.items():
        ds = [d for _, d in rs]
        steps, secs = _vals(ds, "ttc_step"), _vals(ds, "ttc_seconds")
        all_reached = len(steps) == len(ds)
        sm, sh = mean_ci(steps) if all_reached else (None, None)
        tm, th = mean_ci(secs) if all_reached and len(secs) == len(ds) else (None, None)
        out.append({"objective": obj, "n": len(ds), "reached": len(steps), "steps_mean": sm, "steps_ci": sh,
                    "seconds_mean": tm, "seconds_ci": th, "steps_per_seed": [d.ttc_step for d in ds]})
    by_seed = {obj: dict(rs) for obj, rs in groups.items()}
    base = by_seed.get(baseline) if baseline else None
    for r in out:
        for unit, attr in (("steps", "ttc_step"), ("seconds", "ttc_seconds")):
            # per seed: this objective's time / the baseline's time at the same seed; mean ± CI over seeds, given
            # only when both reached the target at every seed of the objective
            ratios = []
            for seed, d in by_seed[r["objective"]].items():
                b = base.get(seed) if base else None
                num, den = getattr(d, attr), getattr(b, attr) if b is not None else None
                if num is not None and den:
                    ratios.append(num / den)
            full = base is not None and len(ratios) == r["n"]
            r[f"{unit}_ratio"], r[f"{unit}_ratio_ci"] = mean_ci(ratios) if full else (None, None)
    return out


def convergence_table(conv: list[dict], target: float, baseline: str | None, why_no_base: str) -> Table:
    rows, csv_rows = [], []
    for r in conv:
        if r["reached"] == r["n"]:
            st = fmt(r["steps_mean"], 1) + (f" ± {fmt(r['steps_ci'], 1)}" if r["steps_ci"] is not None else "")
            se = fmt(r["seconds_mean"], 1) + (f" ± {fmt(r['seconds_ci'], 1)}" if r["seconds_ci"] is not None else "")
        else:
            reached = ", ".join(str(s) for s in r["steps_per_seed"] if s is not None)
            st = f"not reached by {r['n'] - r['reached']}/{r['n']} seeds" + (f" (others: {reached})" if reached else "")
            se = "not reached"
        ratio = [(fmt(r[f"{u}_ratio"], 2) + (f" ± {fmt(r[f'{u}_ratio_ci'], 2)}" if r[f"{u}_ratio_ci"] is not None
                                               else "")) if r[f"{u}_ratio"] is not None else "n/a"
                 for u in ("steps", "seconds")]
        rows.append([r["objective"], str(r["n"]), f"{r['reached']}/{r['n']}", st, se, *ratio])
        csv_rows.append([r["objective"], r["n"], r["reached"], r["steps_mean"], r["steps_ci"], r["seconds_mean"],
                         r["seconds_ci"], r["steps_ratio"], r["steps_ratio_ci"], r["seconds_ratio"],
                         r["seconds_ratio_ci"]])
    base = f"ratio to {baseline}" if baseline else "ratio to baseline"
    return Table("convergence", "Time to convergence",
                 f"First evaluation step (and training wall-clock seconds) at which the smoothed held-out accuracy "
                 f"reaches {target:.4f}; mean ± 95% CI over seeds, given only when every seed reached it. Ratio = "
                 f"the objective's time / the baseline's time at the same seed, mean ± 95% CI over seeds (given when "
                 f"both reached the target at every seed). {why_no_base}".strip(),
                 ["objective", "n", "reached", "steps", "seconds", f"steps {base}", f"seconds {base}"], rows,
                 ["objective", "n", "reached", "steps_mean", "steps_ci95", "seconds_mean", "seconds_ci95",
                  "steps_ratio", "steps_ratio_ci95", "seconds_ratio", "seconds_ratio_ci95"], csv_rows)


STAB = [("entropy_slope", "entropy slope /step", 5), ("acc_drawdown", "acc. drawdown", 3),
        ("grad_spikes", "grad-norm spikes", 1), ("kl_max", "max KL", 4), ("reward_var", "reward var.", 4),
        ("zero_adv_frac", "zero-adv. frac.", 3)]


def stability_table(groups, s: DerivedSettings) -> Table:
    rows, csv_rows = [], []
    for obj, rs in groups.items():
        ds = [d for _, d in rs]
        col = _vals(ds, "entropy_collapse_step")
        if not col:
            cell = f"none (0/{len(ds)})"
        elif len(col) == len(ds):
            cell = fmt_mean_ci(col, 1) + f" ({len(ds)}/{len(ds)})"
        else:
            cell = f"{len(col)}/{len(ds)} seeds: step " + ", ".join(str(c) for c in col)
        row, crow = [obj, str(len(ds)), cell], [obj, len(ds), len(col), *mean_ci(col)]
        for attr, _, digits in STAB:
            v = _vals(ds, attr)
            row.append(fmt_mean_ci(v, digits) if len(v) == len(ds) else f"n/a ({len(ds) - len(v)} seeds lack data)")
            crow.extend(mean_ci(v) if len(v) == len(ds) else (None, None))
        rows.append(row)
        csv_rows.append(crow)
    csv_cols = ["objective", "n", "collapsed", "collapse_step_mean", "collapse_step_ci95"]
    for attr, _, _ in STAB:
        csv_cols += [f"{attr}_mean", f"{attr}_ci95"]
    return Table("stability", "Stability", f"Entropy collapse: first step with mean rollout entropy < "
                 f"{s.collapse_frac} × its initial value. Slope: least-squares entropy change per step. Drawdown: "
                 f"largest fall of held-out accuracy below an earlier peak. Spikes: steps with gradient norm > "
                 f"{s.spike_k} × the median of the previous {s.spike_window}. Max KL to the reference policy; variance "
                 f"of the per-step mean reward across steps; mean fraction of groups with all-equal rewards. "
                 f"Mean ± 95% CI over seeds.",
                 ["objective", "n", "entropy collapse", *[t for _, t, _ in STAB]], rows, csv_cols, csv_rows)


def paired_table(groups, baseline: str | None, why_no_base: str) -> Table:
    rows, csv_rows = [], []
    if baseline in groups:
        base = {seed: d.final_acc for seed, d in groups[baseline] if d.final_acc is not None}
        for obj, rs in groups.items():
            if obj == baseline:
                continue
            pt = paired_test({seed: d.final_acc for seed, d in rs if d.final_acc is not None}, base)
            p = pt.note or fmt(pt.p, 4)
            rows.append([obj, baseline, str(pt.n), fmt(pt.mean_diff, 4), fmt(pt.t, 3), p])
            csv_rows.append([obj, baseline, pt.n, pt.mean_diff, pt.t, pt.p, pt.note])
    caption = ("Paired t-test (scipy.stats.ttest_rel) of per-seed final held-out accuracy against the baseline over "
               "the n seeds both ran; diff = mean(objective - baseline). " + why_no_base).strip()
    return Table("paired_test", f"Paired test against {baseline or 'the baseline'}", caption,
                 ["objective", "baseline", "n", "mean diff", "t", "p-value"], rows,
                 ["objective", "baseline", "n", "mean_diff", "t", "p_value", "note"], csv_rows)


RUN_COLS = ["initial_acc", "final_acc", "best_acc", "ttc_step", "ttc_seconds", "entropy_collapse_step", "entropy_slope",
            "acc_drawdown", "grad_spikes", "kl_max", "reward_var", "zero_adv_frac"]


def runs_table(cmp: Comparison, derived: dict[str, RunDerived]) -> Table:
    rows, csv_rows = [], []
    for r in cmp.runs:
        d = derived[r.run_id]
        vals = [getattr(d, c) for c in RUN_COLS]
        shown = []
        for c, v in zip(RUN_COLS, vals):
            if v is None and c.startswith("ttc"):
                shown.append("not reached")
            elif v is None and c == "entropy_collapse_step":
                shown.append("none")
            else:
                shown.append(fmt(v, 5 if c == "entropy_slope" else 3))
        n_problems = r.params.get("eval_problems", "")
        lo, hi = checks.final_acc_interval(d.final_acc, int(n_problems) if n_problems.isdigit() else None)
        rows.append([r.name, r.variant, str(r.seed), *shown, "n/a" if lo is None else f"[{lo:.3f}, {hi:.3f}]"])
        csv_rows.append([r.run_id, r.name, r.variant, r.seed, *vals, lo, hi])
    return Table("runs", "Per-run derived metrics",
                 "The per-objective tables of report.md are means over these per-run values. final_acc_ci95: Wilson "
                 "95% interval of the run's final held-out accuracy as a proportion of its eval_problems problems "
                 "(correct at 0 and 1; n/a when the run did not log eval_problems).",
                 ["run", "objective", "seed", *RUN_COLS, "final_acc_ci95"], rows,
                 ["run_id", "run", "objective", "seed", *RUN_COLS, "final_acc_ci95_low", "final_acc_ci95_high"],
                 csv_rows)


def _artifact_run(client, cmp: Comparison) -> tuple[str, bool]:
    """The comparison's own MLflow run (kind=comparison); created here when `bench run` did not make one."""
    found = client.search_runs([cmp.experiment_id], filter_string=(
        f"tags.`pobench.kind` = 'comparison' and tags.`pobench.comparison` = '{cmp.comparison_id}'"), max_results=1)
    if found:
        return found[0].info.run_id, False
    run = client.create_run(cmp.experiment_id, run_name=f"comparison-{cmp.comparison_id}", tags={
        KIND: "comparison", COMPARISON: cmp.comparison_id,
        CONFIG_HASH: cmp.config_hash})
    return run.info.run_id, True


def build_report(experiment: str = "pobench", comparison: str | None = None, tracking_uri: str | None = None, *,
                 out_root: str | Path = "reports/out", baseline: str | None = None, target_acc: float | None = None,
                 settings: DerivedSettings | None = None, objectives=None, seeds=None,
                 store_derived: bool = True, log_artifacts: bool = True, figures_too: bool = True,
                 client=None) -> Report:
    """Write the comparison's report into ``<out_root>/<experiment>/`` (replacing what was there) and into MLflow."""
    settings = settings or DerivedSettings()
    if target_acc is not None and not (0.0 <= target_acc <= 1.0):
        raise ValueError(f"--target-acc must be an accuracy in [0, 1], got {target_acc}")
    cmp = load_comparison(experiment, comparison, tracking_uri, objectives=objectives, seeds=seeds, client=client)
    from mlflow import MlflowClient

    client = client or MlflowClient(tracking_uri=cmp.tracking_uri)
    lacking = [r.name for r in cmp.runs if not r.series.get(KEY_ACC)]
    if lacking:
        raise ValueError(f"run(s) {', '.join(lacking)} have no held-out accuracy series ({KEY_ACC}): cannot compare "
                         f"accuracy or convergence (was eval_every 0?)")
    notes: list[str] = []
    explicit = baseline is not None
    baseline = baseline or DEFAULT_BASELINE
    why_no_base = ""
    if baseline not in cmp.objectives:
        if explicit:
            raise ValueError(f"baseline {baseline!r} has no finished run in comparison {cmp.comparison_id!r}; "
                             f"objectives: {', '.join(cmp.objectives)}")
        why_no_base = f"No ratio or test: the default baseline {baseline} is not in this comparison (--baseline)."
        notes.append(why_no_base)
        baseline = None
    target, target_how = _target(cmp, target_acc, baseline, settings, notes)
    derived = {r.run_id: derive(r.series, target, settings) for r in cmp.runs}
    groups = _group(cmp, derived)
    seeds_of = {o: sorted(s for s, _ in rs) for o, rs in groups.items()}
    if len({tuple(v) for v in seeds_of.values()}) > 1:
        notes.append("Objectives do not share the same seeds: " +
                     "; ".join(f"{o}: {', '.join(map(str, s))}" for o, s in seeds_of.items()) + ".")
    for r in cmp.not_finished:
        notes.append(f"Run {r.name} ({r.variant}, seed {r.seed}) is {r.status}, not FINISHED: left out.")
    for r in cmp.runs:
        if r.tags.get(STOPPED) == "early":
            notes.append(f"Run {r.name} was stopped early (pobench.stopped=early).")

    at0 = [r.name for r in cmp.runs if derived[r.run_id].ttc_step == 0]
    if at0:
        notes.append(f"{len(at0)}/{len(cmp.runs)} runs meet the convergence target already at step 0 (before any "
                     f"update), so time to convergence does not separate them; fix a target with --target-acc.")
    ranking = checks.ranking_note({o: _vals([d for _, d in rs], "final_acc") for o, rs in groups.items()}, mean_ci)
    if ranking:
        notes.append(ranking)
    first_eval = [next((s for s, _ in sorted(r.series[KEY_ACC]) if s > 0), None) for r in cmp.runs]
    late = checks.first_evaluation_note([derived[r.run_id].ttc_step for r in cmp.runs], first_eval, target,
                                        _vals(list(derived.values()), "initial_acc"))
    if late:
        notes.append(late)
    conv = convergence_rows(groups, baseline)
    from reports.distinguish import probe_table

    probe_tab, probe_warnings = probe_table(cmp)  # what can differ at all under this configuration
    notes += [f"Probe: {w}." for w in probe_warnings]
    tables = {t.name: t for t in (accuracy_table(groups), convergence_table(conv, target, baseline, why_no_base),
                                  stability_table(groups, settings), paired_table(groups, baseline, why_no_base),
                                  runs_table(cmp, derived), probe_tab)}
    out_dir = Path(out_root) / _safe(experiment)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        files: list[Path] = []
        for t in tables.values():
            files += t.write(tmp)
        def series(key: str, ylabel: str, title: str, name: str) -> list[Path] | str:
            """The figure of ``key``, or why it is not drawn (a quantity that never varies)."""
            if not checks.varies(cmp.runs, key):
                return checks.constant_reason(cmp.runs, key)
            return figures.series_figure(cmp.runs, key, ylabel, title, tmp, name)

        figs = {} if not figures_too else {
            "accuracy_vs_step": figures.series_figure(cmp.runs, KEY_ACC, "held-out accuracy (greedy)",
                                                      "Held-out accuracy vs step", tmp, "accuracy_vs_step"),
            "accuracy_vs_time": figures.accuracy_time_figure(cmp.runs, tmp),
            "train_accuracy": series(K.ROLLOUT_ACCURACY, "verifier accuracy of rollouts",
                                     "Training accuracy vs step (verifier, first round)", "train_accuracy_vs_step"),
            "reward": series(K.REWARD_MEAN, "mean shaped reward",
                             "Training reward vs step (as shaped by each objective)", "reward_vs_step"),
            "refill": series(K.REFILL_COMPLETIONS, "completions",
                             "Refill-round completions per step (dynamic sampling)", "refill_vs_step"),
            "entropy": series(K.ENTROPY_MEAN, "mean token entropy (nats)", "Rollout entropy vs step",
                              "entropy_vs_step"),
            "fractions": figures.fractions_figure(cmp.runs, tmp) or
            "no clip / mask / selection fraction varies in any run",
            "ttc": figures.ttc_figure(conv, target, tmp),
        }
        for v in figs.values():
            files += v if isinstance(v, list) else []
        (tmp / "report.md").write_text(_markdown(cmp, tables, figs, target_how, baseline, settings, notes))
        files.append(tmp / "report.md")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    files = [out_dir / f.name for f in files]
    rep = Report(out_dir, cmp, target, baseline, derived, tables, files, notes)
    if store_derived:
        for r in cmp.runs:
            store(client, r.run_id, derived[r.run_id], cmp.comparison_id)
    if log_artifacts:
        run_id, created = _artifact_run(client, cmp)
        client.log_artifacts(run_id, str(out_dir), artifact_path="report")
        if created:
            client.set_terminated(run_id)
        rep.artifact_run_id = run_id
    return rep


def _target(cmp: Comparison, target_acc: float | None, baseline: str | None, settings: DerivedSettings,
            notes: list[str]) -> tuple[float, str]:
    """The convergence target and the sentence that states it in the report (inf = no target)."""
    if target_acc is not None:
        return target_acc, f"smoothed held-out accuracy ≥ {target_acc:.4f} (given with --target-acc)"
    ref = baseline or cmp.objectives[0]
    t = default_target([r.series[KEY_ACC] for r in cmp.runs],
                       [r.series[KEY_ACC] for r in cmp.runs if r.variant == ref], settings)
    made = (f"step-0 accuracy {t.start:.4f} + {t.frac:g} × the improvement of {ref}'s seed-mean smoothed accuracy "
            f"(best {t.reference_best:.4f})")
    if t.value is None:
        notes.append(f"{ref} did not improve over the step-0 accuracy ({t.start:.4f}; best seed-mean smoothed "
                     f"{t.reference_best:.4f}), so there is no default convergence target: time to convergence is "
                     "reported as not reached (give one with --target-acc).")
        return float("inf"), f"none ({made} does not exist)"
    return t.value, f"smoothed held-out accuracy ≥ {t.value:.4f} = {made}"


def _markdown(cmp: Comparison, tables: dict[str, Table], figs: dict[str, list[Path] | str], target_how: str,
              baseline: str | None, s: DerivedSettings, notes: list[str]) -> str:
    p = cmp.runs[0].params
    setup = ", ".join(f"{k}={p[k]}" for k in PARAMS_SHOWN if k in p)
    seeds = sorted({r.seed for r in cmp.runs})

    def img(key: str, alt: str) -> str:
        paths = figs.get(key) or []
        if not figs:
            return f"*{alt}: figures not drawn (figures_too=False).*\n"
        if isinstance(paths, str):
            return f"*{alt}: not drawn: {paths}.*\n"
        if not paths:
            return f"*{alt}: no run logged these series.*\n"
        png = next(x.name for x in paths if x.suffix == ".png")
        pdf = next(x.name for x in paths if x.suffix == ".pdf")
        return f"![{alt}]({png}) ([PDF]({pdf}))\n"

    def tab(name: str) -> str:
        t = tables[name]
        return (f"### {t.title}\n\n{t.markdown()}\n{t.caption} "
                f"([CSV]({name}.csv), [LaTeX]({name}.tex))\n")

    lines = [
        f"# Comparison `{cmp.comparison_id}` — experiment `{cmp.experiment}`\n",
        f"{len(cmp.runs)} finished runs: objectives {', '.join(cmp.objectives)}; seeds {', '.join(map(str, seeds))}. "
        f"Identical conditions (config hash `{cmp.config_hash}`){': ' + setup if setup else ''}. "
        f"Baseline: {baseline or 'none'}. Convergence target: {target_how} "
        f"(smoothed = trailing mean of {s.smooth_window} evaluations). Read from MLflow at `{cmp.tracking_uri}`. "
        f"Bands in figures: min-max over seeds around the seed mean. Definitions: `docs/REPORTS.md`.\n",
    ]
    if notes:
        lines.append("**Notes.** " + " ".join(notes) + "\n")
    lines += [tab("distinguishability"), tab("accuracy"), tab("paired_test"), tab("convergence"), tab("stability"),
              "## Figures\n",
              img("accuracy_vs_step", "held-out accuracy vs step"), img("accuracy_vs_time", "accuracy vs time"),
              img("train_accuracy", "training verifier accuracy vs step"),
              img("reward", "shaped reward vs step"), img("refill", "refill-round completions vs step"),
              img("entropy", "entropy vs step"),
              img("fractions", "clip and masked fractions"), img("ttc", "time to convergence"),
              "Per-run values: [runs.md](runs.md), [runs.csv](runs.csv).\n"]
    return "\n".join(lines)
