"""`bench report`: build a comparison's figures, tables and one-page ``report.md`` from MLflow alone.

``analyse`` turns a loaded comparison (``reports.load``) into its derived numbers (``reports.derived``), tables
(``reports.sections``, ``reports.evals``) and notes; ``build_report`` draws the figures (``reports.plots``), exports
the curves (``reports.curves``), stores the derived numbers back into each run (``derived/<name>`` metrics), writes
everything into ``<out_root>/<experiment>/<comparison>/`` and logs that folder as artifacts (``report/``) of the
comparison's MLflow run (``pobench.kind=comparison``, created if absent).

The folder is written under a temporary name and swapped in whole (``reports.paths.replace_owned``): only folders
pobench marked as its own are replaced, so reporting comparison B never touches comparison A's report, and a foreign
folder in the way (or a name that would leave ``out_root``) is refused with one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reports import checks, sections
from reports.claims import claim_verdicts, claims_table
from reports.controls import control_bases, control_results, controls_note, controls_table
from reports.derived import KEY_ACC, DerivedSettings, RunDerived, default_target, derive, store
from reports.figures import CROWDED, FigureOptions, figure_formats
from reports.load import Comparison, load_comparison
from reports.record import BASELINE, COMPARISON, CONFIG_HASH, KIND, OBJECTIVES, SEEDS, STOPPED
from reports.tables import Table, Units

DEFAULT_BASELINE = "grpo"
PARAMS_SHOWN = ("model", "task", "eval_task", "steps", "prompts_per_step", "group_size", "max_new_tokens", "lr",
                "eval_every", "eval_problems", "backend", "engine")


@dataclass(frozen=True)
class ReportOptions:
    """How a report is drawn and printed (the flags of `bench report` / `bench run` / `bench compare`)."""

    titles: bool = True              # --no-titles: figures without titles (the paper's caption says it)
    band: str = "ci"                 # --band: "ci" (95% t interval of the seed mean) | "minmax"
    percent: bool = True             # --fractions: accuracies as fractions instead of percent
    metrics: tuple[str, ...] = ()    # --metrics: extra logged metrics, one figure each (and in curves.csv)
    formats: tuple[str, ...] | None = None  # --formats: each figure's files (None: $POBENCH_FIGURE_FORMATS, else all)

    @property
    def units(self) -> Units:
        return Units(self.percent)

    @property
    def figure_options(self) -> FigureOptions:
        return FigureOptions(titles=self.titles, band=self.band, units=self.units,
                             formats=figure_formats(self.formats))


@dataclass
class Analysis:
    """Everything a report states about one comparison, before anything is written."""

    comparison: Comparison
    baseline: str | None
    baseline_how: str
    target: float | None             # None: no convergence target
    target_how: str
    interval: str                    # the evaluation interval the convergence is interpolated over
    derived: dict[str, RunDerived]   # run_id -> derived numbers
    groups: sections.Groups
    conv: list[dict]
    paired: list[dict]
    tables: dict[str, Table]
    notes: list[str] = field(default_factory=list)
    fits: dict = field(default_factory=dict)         # objective -> reports.fit.ComputeFit (accuracy vs tokens)
    fit_verdicts: list[str] = field(default_factory=list)  # each objective against the baseline: A, B, C_mid


@dataclass
class Report:
    out_dir: Path
    comparison: Comparison
    target_acc: float | None
    baseline: str | None
    derived: dict[str, RunDerived]
    tables: dict[str, Table] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    artifact_run_id: str | None = None
    figures: dict = field(default_factory=dict)  # figure key -> reports.figures.Drawn, or why it is not drawn
    kept: list[str] = field(default_factory=list)  # a user's files in the folder (carried over from the last report)


def log_written(client, run_id: str, folder: Path, kept: list[str]) -> None:
    """The report folder as the run's ``report`` artifacts: pobench's files only (a user's ``kept`` stay local)."""
    if not kept:
        client.log_artifacts(run_id, str(folder), artifact_path="report")
        return
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "report"
        shutil.copytree(folder, copy, symlinks=True, ignore_dangling_symlinks=True)
        for rel in kept:
            (copy / rel).unlink(missing_ok=True)
            for d in (copy / rel).parents:  # (a folder that held only the user's files goes too)
                if d == copy or any(d.iterdir()):
                    break
                d.rmdir()
        client.log_artifacts(run_id, str(copy), artifact_path="report")


def resolve_baseline(cmp: Comparison, baseline: str | None, recorded: str | None = None) -> tuple[str, str]:
    """(baseline, how it was chosen): ``baseline`` when given (it must have finished runs), else the one recorded on
    the comparison run (``pobench.baseline``: `bench run`'s choice, or the last report's), else ``grpo`` when in the
    comparison, else the comparison's first objective."""
    if baseline is not None:
        if baseline not in cmp.objectives:
            raise ValueError(f"baseline {baseline!r} has no finished run in comparison {cmp.comparison_id!r}; "
                             f"objectives: {', '.join(cmp.objectives)}")
        return baseline, "given: --baseline, or the root of bench run --ablation"
    if recorded in cmp.objectives:
        return recorded, "recorded on the comparison run"
    if DEFAULT_BASELINE in cmp.objectives:
        return DEFAULT_BASELINE, "the default"
    return cmp.objectives[0], "the comparison's first objective"


def missing_note(cmp: Comparison) -> str:
    """The note of the pairs the comparison records but the store has no run of ("" when none)."""
    if not cmp.missing:
        return ""
    return (f"{len(cmp.missing)} pair(s) the comparison records have no run in the store (deleted, or never trained), "
            "so this report covers less than the comparison: " + ", ".join(f"{o} seed {s}" for o, s in cmp.missing)
            + ". `bench run` with the comparison's arguments trains them again.")


def _group(cmp: Comparison, derived: dict[str, RunDerived]) -> sections.Groups:
    out: sections.Groups = {o: [] for o in cmp.objectives}
    for r in cmp.runs:
        out[r.variant].append((r.seed, derived[r.run_id]))
    return out


def eval_interval(cmp: Comparison) -> str:
    """The evaluation interval in words ("evaluations every 2 steps"), from the runs' held-out series."""
    gaps = sorted({b - a for r in cmp.runs for (a, _), (b, _) in zip(r.series[KEY_ACC], r.series[KEY_ACC][1:])})
    if not gaps:
        return "one evaluation per run"
    if len(gaps) == 1:
        return f"evaluations every {gaps[0]} step{'s' if gaps[0] != 1 else ''}"
    return f"evaluations {gaps[0]}-{gaps[-1]} steps apart"


def analyse(cmp: Comparison, *, baseline: str | None = None, recorded_baseline: str | None = None,
            target_acc: float | None = None, settings: DerivedSettings | None = None,
            units: Units | None = None, evals: list | None = None, left_running=None) -> Analysis:
    """Derived numbers, tables and notes of a loaded comparison (nothing written). ``left_running(run)``: what is
    known of the process of a run not FINISHED (``bench.runs.run.left_running``: still training it, or gone and how
    to complete the run), added to its note; None when nothing is known."""
    settings = settings or DerivedSettings()
    units = units or Units()
    if target_acc is not None and not (0.0 <= target_acc <= 1.0):
        raise ValueError(f"--target-acc must be an accuracy in [0, 1], got {target_acc}")
    lacking = [r.name for r in cmp.runs if not r.series.get(KEY_ACC)]
    if lacking:
        raise ValueError(f"run(s) {', '.join(lacking)} have no held-out accuracy series ({KEY_ACC}): cannot compare "
                         f"accuracy or convergence (was eval_every 0?)")
    base, base_how = resolve_baseline(cmp, baseline, recorded_baseline)
    notes: list[str] = []
    target, target_how = _target(cmp, target_acc, base, settings, units, notes)
    derived = {r.run_id: derive(r.series, target, settings) for r in cmp.runs}
    groups = _group(cmp, derived)
    seeds_of = {o: sorted(s for s, _ in rs) for o, rs in groups.items()}
    if len({tuple(v) for v in seeds_of.values()}) > 1:
        notes.append("Objectives do not share the same seeds: " +
                     "; ".join(f"{o}: {', '.join(map(str, s))}" for o, s in seeds_of.items()) + ".")
    for r in cmp.not_finished:
        known = left_running(r) if left_running is not None and r.status == "RUNNING" else None
        notes.append(f"Run {r.name} ({r.variant}, seed {r.seed}) is {r.status}, not FINISHED: left out"
                     + (f"; {known}." if known else "."))
    if cmp.missing:
        notes.append(missing_note(cmp))
    for r in cmp.other_config:
        notes.append(f"Run {r.name} ({r.variant}, seed {r.seed}) was trained under another configuration (config "
                     f"hash {r.config_hash}) than the comparison records: left out.")
    notes += cmp.odd  # runs whose tags contradict their params, two runs for one pair (held-out round 11, H11)
    if baseline is None and recorded_baseline and recorded_baseline not in cmp.objectives:
        notes.append(f"The recorded baseline {recorded_baseline} has no finished run here, so this report compares "
                     f"against {base} ({base_how}); the comparison keeps {recorded_baseline} as its baseline.")
    for r in cmp.runs:
        if r.tags.get(STOPPED) == "early":
            notes.append(f"Run {r.name} was stopped early (pobench.stopped=early).")
    written = checks.written_by_note(cmp.runs)  # reused runs from another version / commit, a dirty checkout
    if written:
        notes.append(written)
    at0 = [r.name for r in cmp.runs if derived[r.run_id].ttc_step == 0]
    if at0:
        notes.append(f"{len(at0)}/{len(cmp.runs)} runs meet the convergence target already at step 0 (before any "
                     f"update), so time to convergence does not separate them; fix a target with --target-acc.")
    bases = control_bases(cmp.runs)  # positive controls: their own section and Holm family, not the ranking's
    results = control_results(sections.finals(groups), bases, base)
    notes.insert(0, controls_note(results, units))
    real = {o: rs for o, rs in groups.items() if o not in bases}
    paired = sections.paired_rows(real, base)
    finals = {o: [d.final_acc for _, d in rs if d.final_acc is not None] for o, rs in real.items()}
    ranking = checks.ranking_note(finals, sections.stats.mean_ci)
    if ranking:
        best, others = checks.unresolved(finals, sections.stats.mean_ci)
        power = sections.power_note(groups, best, others, units)
        notes.append(ranking + (f" {power}" if power else ""))
    if target is not None:
        first_eval = [next((s for s, _ in sorted(r.series[KEY_ACC]) if s > 0), None) for r in cmp.runs]
        late = checks.first_evaluation_note([derived[r.run_id].ttc_step for r in cmp.runs], first_eval, target,
                                            [d.initial_acc for d in derived.values() if d.initial_acc is not None])
        if late:
            notes.append(late)
    conv = sections.convergence_rows(groups, base)
    interval = eval_interval(cmp)
    from reports.distinguish import probe_table

    probe_tab, probe_warnings = probe_table(cmp)  # what can differ at all under this configuration
    notes += [f"Probe: {w}." for w in probe_warnings]
    runs_tab, runs_stab = sections.runs_tables(cmp, derived, units)
    target_text = f"≥ {target_how}" if target is not None else f"none: {target_how}"
    from reports import fit

    fits = fit.compute_fits(cmp)
    tabs = [*([controls_table(results, units)] if results else []), probe_tab,
            sections.accuracy_table(groups, units), sections.aggregates_table(groups, units),
            sections.paired_table(paired, base, units), sections.convergence_table(conv, target_text, interval, base),
            fit.fit_table(fits, units), sections.stability_table(groups, settings, units), runs_tab, runs_stab]
    verdicts = claim_verdicts(groups, {o: {s: d.ttc_tokens_interp for s, d in rs} for o, rs in groups.items()})
    if verdicts:
        tabs.append(claims_table(verdicts, units, "sampled completion tokens"))
    if evals:
        from reports.evals import benchmark_table

        bench_tab, bench_notes = benchmark_table(cmp, evals, units)
        if bench_tab is not None:
            tabs.append(bench_tab)
            notes += bench_notes
    return Analysis(cmp, base, base_how, target, target_how, interval, derived, groups, conv, paired,
                    {t.name: t for t in tabs}, notes, fits, fit.verdicts(fits, base))


def comparison_run(client, cmp: Comparison):
    """The comparison's own MLflow run (kind=comparison), or None."""
    found = client.search_runs([cmp.experiment_id], filter_string=(
        f"tags.`{KIND}` = 'comparison' and tags.`{COMPARISON}` = '{cmp.comparison_id}'"), max_results=1)
    return found[0] if found else None


def deleted_run_note(client, cmp: Comparison, new_run: bool) -> str:
    """The note of a comparison whose own MLflow run was deleted ("" when none was): held-out round 11 (H20), its
    report then chose the default baseline and made a new comparison run, without a word."""
    from mlflow.entities import ViewType

    gone = client.search_runs([cmp.experiment_id], filter_string=(
        f"tags.`{KIND}` = 'comparison' and tags.`{COMPARISON}` = '{cmp.comparison_id}'"),
        run_view_type=ViewType.DELETED_ONLY, max_results=1)
    if not gone:
        return ""
    t, rid = gone[0].data.tags, gone[0].info.run_id
    record = ", ".join(f"{what} {t[k]}" for what, k in (("baseline", BASELINE), ("objectives", OBJECTIVES),
                                                         ("seeds", SEEDS)) if t.get(k))
    return (f"The comparison's own MLflow run {rid} was deleted in MLflow{f' (it recorded {record})' if record else ''}"
            ": this report does not use its record, so the baseline is chosen as without one and pairs it recorded "
            "that the store lacks cannot be named" + ("; a new comparison run holds this report" if new_run else "")
            + f". Restore the deleted run (MLflow's deleted runs, or MlflowClient().restore_run('{rid}')) and report "
            "again to use its record.")


def _artifact_run(client, cmp: Comparison) -> tuple[str, bool]:
    """The comparison's own MLflow run; created here when `bench run` did not make one."""
    found = comparison_run(client, cmp)
    if found is not None:
        return found.info.run_id, False
    run = client.create_run(cmp.experiment_id, run_name=f"comparison-{cmp.comparison_id}", tags={
        KIND: "comparison", COMPARISON: cmp.comparison_id, CONFIG_HASH: cmp.config_hash})
    return run.info.run_id, True


def _mlflow_artifacts(folder: Path) -> bool:
    """``folder`` looks like an experiment's folder of MLflow's artifact root: ``<run id>/artifacts`` inside."""
    import itertools

    try:
        return folder.is_dir() and any((c / "artifacts").is_dir() for c in itertools.islice(folder.iterdir(), 50))
    except OSError:
        return False


def report_folder(out_root: str | Path, experiment: str, comparison: str | None = None) -> Path:
    """``<out_root>/<experiment>/<comparison>`` (each a safe path component, contained in ``out_root``); the
    experiment folder must be pobench's or absent (refused with one line otherwise). Without ``comparison``: the
    experiment folder, checked only."""
    from reports.edits import check_unedited
    from reports.paths import UnsafePath, check_not_runs, contained, is_owned, safe_component

    exp_dir = contained(out_root, safe_component(experiment, "--experiment"))
    if (exp_dir.exists() or exp_dir.is_symlink()) and (exp_dir.is_symlink() or not is_owned(exp_dir)):
        if _mlflow_artifacts(exp_dir):  # (moving it away, as the line below advises, breaks the store's runs)
            raise UnsafePath(f"{exp_dir} is MLflow's artifact folder (its runs' files, which the store points to): not "
                             "writing reports into it; choose another --out-root, and leave that folder where it is")
        check_not_runs(exp_dir)  # (its run folders: held-out round 17, H22, H26, "not created by pobench")
        raise UnsafePath(f"{exp_dir} exists and was not created by pobench (no .pobench-owned file): not writing "
                         f"reports into it; move it away or choose another --out-root / --experiment")
    if comparison is None:
        return exp_dir
    dest = contained(out_root, exp_dir.name, safe_component(comparison, "--comparison"))
    check_unedited(dest, "the report folder")  # a report file the user edited: one line, not replaced (H14)
    return dest


def build_report(experiment: str = "pobench", comparison: str | None = None, tracking_uri: str | None = None, *,
                 out_root: str | Path = "reports/out", baseline: str | None = None, target_acc: float | None = None,
                 settings: DerivedSettings | None = None, objectives=None, seeds=None, options: ReportOptions | None
                 = None, store_derived: bool = True, log_artifacts: bool = True, figures_too: bool = True,
                 client=None, on_busy=lambda line: None, left_running=None) -> Report:
    """Write the comparison's report into ``<out_root>/<experiment>/<comparison>/`` (replacing only that folder, and
    only when pobench made it) and into MLflow. The folder is held from the write of the report to its record in
    MLflow (another report of it at once is waited for, ``on_busy(line)`` told; with ``on_busy=None`` refused in one
    line, as `bench report` does: ``reports.paths.hold_out_folder``; held-out round 11, H21). ``left_running``: see
    :func:`analyse`."""
    from mlflow import MlflowClient

    from reports.evals import load_evals
    from reports.paths import hold_out_folder, make_owned

    options = options or ReportOptions()
    settings = settings or DerivedSettings()
    report_folder(out_root, experiment)  # a foreign folder in the way: one line before any work
    extra = tuple(k for k in options.metrics if k)
    cmp = load_comparison(experiment, comparison, tracking_uri, objectives=objectives, seeds=seeds, client=client,
                          extra_keys=extra)
    client = client or MlflowClient(tracking_uri=cmp.tracking_uri)
    crun = comparison_run(client, cmp)
    recorded = crun.data.tags.get(BASELINE) if crun is not None else None
    a = analyse(cmp, baseline=baseline, recorded_baseline=recorded, target_acc=target_acc, settings=settings,
                units=options.units, evals=load_evals(client, cmp), left_running=left_running)
    if crun is None and (gone := deleted_run_note(client, cmp, log_artifacts)):  # (said, not silent: H20)
        a.notes.append(gone)
    dest = report_folder(out_root, experiment, cmp.comparison_id)
    make_owned(dest.parent, "reports")
    hold = hold_out_folder(dest, "report", "the report folder", "run this one again once it has ended (its report then "
                           "replaces that one), or give another --out-root", on_busy)  # (two at once: one lost, H21)
    try:
        rep = _write(a, dest, out_root, settings, options, extra, figures_too)
    except BaseException:
        hold.release()
        raise
    try:
        if store_derived:
            for r in cmp.runs:
                store(client, r.run_id, a.derived[r.run_id], cmp.comparison_id)
        if log_artifacts:
            run_id, created = _artifact_run(client, cmp)
            log_written(client, run_id, dest, rep.kept)
            if recorded is None or recorded in cmp.objectives or baseline is not None:  # (a stand-in: not recorded)
                client.set_tag(run_id, BASELINE, a.baseline)
            log_summary(client, run_id, a)
            if created:
                client.set_terminated(run_id)
            rep.artifact_run_id = run_id
    except Exception as e:  # (the store failed once the folder was written: the caller can say it is kept)
        e.report_folder = dest
        raise
    finally:
        hold.release()
    return rep


def _write(a: Analysis, dest: Path, out_root, settings: DerivedSettings, options: ReportOptions,
           extra: tuple[str, ...], figures_too: bool) -> Report:
    """The report's files, written into a temporary folder swapped in for ``dest`` whole."""
    from reports import curves, plots
    from reports.paths import new_temp_folder, remove_owned, replace_owned, user_files

    cmp = a.comparison
    tmp = new_temp_folder(dest)
    try:
        files: list[Path] = []
        for t in a.tables.values():
            files += t.write(tmp)
        figs = {} if not figures_too else plots.draw_all(cmp, a.conv, a.target, a.target_how, a.interval, tmp,
                                                         options.figure_options, extra, a.baseline, a.fits)
        for v in figs.values():
            files += v.paths if not isinstance(v, str) else []
        files += curves.write_curves(cmp, plots.plotted_keys(extra), tmp, options.units)
        (tmp / "report.md").write_text(_markdown(a, figs, settings, options, bool(figures_too)))
        files.append(tmp / "report.md")
        replace_owned(tmp, dest, out_root)
    finally:
        if tmp.exists():
            remove_owned(tmp, out_root)
    files = [dest / f.name for f in files]
    return Report(dest, cmp, a.target, a.baseline, a.derived, a.tables, files, a.notes, figures=figs,
                  kept=user_files(dest))


def log_summary(client, run_id: str, a: Analysis) -> None:
    """The comparison's headline numbers as metrics of its own run (``sections.summary_metrics``; a later report
    with another baseline logs a newer value of the same key: MLflow shows the latest)."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0) for k, v in sections.summary_metrics(a.groups, a.paired).items()]
    if metrics:
        client.log_batch(run_id, metrics=metrics)


def _target(cmp: Comparison, target_acc: float | None, baseline: str, settings: DerivedSettings, units: Units,
            notes: list[str]) -> tuple[float | None, str]:
    """The convergence target (None = no target) and the sentence that states it (in the report's units, two more
    digits than the tables)."""
    def acc(x: float) -> str:
        return f"{100 * x:.2f}%" if units.percent else f"{x:.4f}"

    if target_acc is not None:
        return target_acc, f"{acc(target_acc)} (given with --target-acc)"
    t = default_target([r.series[KEY_ACC] for r in cmp.runs],
                       [r.series[KEY_ACC] for r in cmp.runs if r.variant == baseline], settings)
    made = (f"step-0 accuracy {acc(t.start)} + {t.frac:g} × the improvement of {baseline}'s seed-mean smoothed "
            f"accuracy (best {acc(t.reference_best)})")
    if t.value is None:
        notes.append(f"{baseline} did not improve over the step-0 accuracy ({acc(t.start)}; best seed-mean smoothed "
                     f"{acc(t.reference_best)}), so there is no default convergence target: time to convergence is "
                     "not reported (give a target with --target-acc).")
        return None, f"{baseline} did not improve over step 0, so {made} does not exist"
    return t.value, f"{acc(t.value)} = {made}"


def _markdown(a: Analysis, figs: dict, s: DerivedSettings, options: ReportOptions, drawn: bool) -> str:
    from reports.plots import FIGURES

    cmp = a.comparison
    p = cmp.runs[0].params
    setup = ", ".join(f"{k}={p[k]}" for k in PARAMS_SHOWN if p.get(k) not in (None, "", "None"))
    if "eval_task" in p and p["eval_task"] in ("", "None") and "task" in p:
        setup += f", held-out problems from the task {p['task']}"
    seeds = sorted({r.seed for r in cmp.runs})

    def img(key: str, alt: str) -> str:
        v = figs.get(key)
        if not drawn:
            return f"*{alt}: figures not drawn (figures_too=False).*\n"
        if isinstance(v, str):
            return f"*{alt}: not drawn: {v}.*\n"
        if v is None:
            return ""
        name = next(x.name for x in v.paths if x.suffix == ".png")
        others = ", ".join(f"[{x.suffix[1:].upper()}]({x.name})" for x in v.paths if x.suffix != ".png")
        said = "; ".join(x for x in (others, f"{v.note}, where the 95% interval passes it" if v.note else "") if x)
        return f"![{alt}]({name})" + (f" ({said})" if said else "") + "\n"

    def tab(name: str) -> str:
        t = a.tables[name]
        return (f"### {t.title}\n\n{t.markdown()}\n{t.caption} "
                f"([CSV]({name}.csv), [LaTeX]({name}.tex))\n")

    target = (f"smoothed held-out accuracy ≥ {a.target_how}" if a.target is not None
              else f"none ({a.target_how})")
    band = ("95% Student-t confidence interval of the seed mean, cut where it passes the values the quantity can take "
            f"(0 for a KL, a count, a length; 0 and {'100%' if options.units.percent else '1'} for an accuracy: "
            "`docs/REPORTS.md`), which the figure's legend then says (\"band cut at 0\")" if options.band == "ci"
            else "min-max over seeds")
    unit = ("Accuracies in % and their differences in points" if options.units.percent
            else "Accuracies and their differences as fractions")
    unit += (" in tables, notes, figures and curves.csv (the tables' CSV files hold fractions, as MLflow; "
             "docs/REPORTS.md)")
    if len(cmp.objectives) > CROWDED:
        band += (f" (with more than {CROWDED} objectives drawn only in the per-objective panels figures, `*_panels`, "
                 f"where the baseline's mean is the grey line)")
    lines = [
        f"# Comparison `{cmp.comparison_id}` — experiment `{cmp.experiment}`\n",
        f"{len(cmp.runs)} finished runs: objectives {', '.join(cmp.objectives)}; seeds {', '.join(map(str, seeds))}. "
        f"Identical conditions (config hash `{cmp.config_hash}`){': ' + setup if setup else ''}. "
        f"Baseline: {a.baseline} ({a.baseline_how}). Convergence target: {target} "
        f"(smoothed = trailing mean of {s.smooth_window} evaluations; {a.interval}). {unit}. "
        f"Read from MLflow at `{cmp.tracking_uri}`. Lines in figures: seed mean; bands: {band}. Every plotted "
        f"series: [curves.csv](curves.csv). Definitions: `docs/REPORTS.md`.\n",
    ]
    if a.notes:
        lines.append("**Notes.** " + " ".join(a.notes) + "\n")
    lines += [tab(n) for n in ("controls", "distinguishability", "accuracy", "aggregates", "paired_test", "convergence",
                               "compute_fit") if n in a.tables]
    if a.fit_verdicts:
        lines.append("**Compute fit against the baseline** (95% bootstrap intervals disjoint or not): " +
                     " ".join(a.fit_verdicts) + "\n")
    lines += [tab(n) for n in ("stability", "claims") if n in a.tables]
    if "benchmarks" in a.tables:
        lines.append(tab("benchmarks"))
    lines.append("## Figures\n")
    for fig in FIGURES:
        k = fig.key
        lines.append(img(k, fig.alt))
        if f"{k}:panels" in figs:
            lines.append(img(f"{k}:panels", f"{fig.alt}, one panel per objective with its band"))
    lines += [img(k, k.split(":", 1)[1]) for k in figs if k.startswith("metric:")]
    lines.append("Per-run values: [runs.md](runs.md), [runs_stability.md](runs_stability.md), "
                 "[runs.csv](runs.csv).\n")
    return "\n".join(lines)
