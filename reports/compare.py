"""`bench compare A B`: stored comparisons side by side (the native loop vs ``--engine trl``, 10 vs 40 steps, ...).

Each comparison is analysed exactly as `bench report` analyses it (``reports.report.analyse``: its own baseline
rule, convergence target and statistics); every per-objective table of the report is then laid out with one column
group per comparison, rows matched by objective. ``compare_config`` lists the settings whose resolved values differ
(the runs' MLflow params and the engine; a setting a run did not record counts as its default; an objective's own
fields only for the objectives both comparisons ran). Written into
``<out_root>/<experiment of the first>/compare-<A>-<B>/`` (``compare.md`` and each table as .md / .tex / .csv),
swapped in like a report folder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from reports.record import ENGINE as ENGINE_TAG
from reports.report import Analysis, ReportOptions, missing_note
from reports.tables import Table

SIDE_BY_SIDE = ("accuracy", "aggregates", "paired_test", "convergence", "stability", "benchmarks")
PER_RUN_PARAMS = {"algo", "seed", "run_name", "comparison", "output_dir", "resume", "objective_overrides",
                  "tracking_uri", "experiment", "tags", "control"}
ABSENT = "–"  # an objective a comparison does not have
UNRECORDED = "not recorded"  # a setting neither a run nor a known default gives


@dataclass
class CompareResult:
    out_dir: Path
    labels: list[str]
    analyses: list[Analysis]
    tables: dict[str, Table] = field(default_factory=dict)


def parse_spec(spec: str, experiment: str) -> tuple[str, str]:
    """``ID`` (in ``experiment``) or ``EXPERIMENT:ID``."""
    exp, sep, cid = spec.rpartition(":")
    if not spec.strip() or (sep and not cid):
        raise ValueError(f"comparison {spec!r}: expected ID or EXPERIMENT:ID")
    return (exp, cid) if sep else (experiment, spec)


def side_by_side(name: str, labels: list[str], tables: list[Table | None]) -> Table | None:
    """One table of the same name from each comparison, columns grouped per comparison, rows by objective."""
    present = [(lab, t) for lab, t in zip(labels, tables) if t is not None]
    if len(present) < 2:
        return None
    first = present[0][1]
    objectives: list[str] = []
    for _, t in present:
        objectives += [r[0] for r in t.rows if r[0] not in objectives]
    columns, groups, csv_columns = [first.columns[0]], [""], ["objective"]
    for lab, t in present:
        columns += t.columns[1:]
        groups += [lab] * (len(t.columns) - 1)
        csv_columns += [f"{lab}.{c}" for c in t.csv_columns[1:]]
    rows, csv_rows, bold = [], [], set()
    for i, obj in enumerate(objectives):
        row, crow, offset = [obj], [obj], 1
        for _, t in present:
            k = next((k for k, r in enumerate(t.rows) if r[0] == obj), None)
            width = len(t.columns) - 1
            row += t.rows[k][1:] if k is not None else [ABSENT] * width
            crow += t.csv_rows[k][1:] if k is not None else [None] * (len(t.csv_columns) - 1)
            bold |= {(i, offset + j - 1) for (r, j) in t.bold if r == k and j > 0} if k is not None else set()
            offset += width
        rows.append(row)
        csv_rows.append(crow)
    caption = (f"{first.title}, one column group per comparison ({', '.join(lab for lab, _ in present)}); each as "
               f"in its own report: {first.caption} {ABSENT}: not in that comparison.")
    return Table(f"compare_{name}", f"{first.title}: side by side", caption, columns, rows, csv_columns, csv_rows,
                 bold, groups)


OBJECTIVE_FIELD = "objective."  # the prefix of an objective's own config fields among a run's params


def _resolved(runs, keys: set[str], defaults: Callable[[str], Mapping[str, str]] | None
              ) -> dict[str, set[tuple[str, bool]]]:
    """key -> the set of (value, recorded) the runs resolve it to: the value a run logged, else its objective's
    default (``defaults(objective)``: the params a run of that objective records with every default; ``recorded``
    False), else (UNRECORDED, False)."""
    out: dict[str, set[tuple[str, bool]]] = {}
    for r in runs:
        default = defaults(r.objective) if defaults is not None and keys - set(r.params) else {}
        for k in keys:
            out.setdefault(k, set()).add((r.params[k], True) if k in r.params else (default.get(k, UNRECORDED), False))
    return out


def _cell(values: set[tuple[str, bool]]) -> str:
    """A comparison's value of a setting: one value ("(default)" when no run recorded it), or the values its runs
    differ in."""
    shown = sorted({v for v, _ in values})
    if len(shown) > 1:
        return "varies between its runs: " + ", ".join(shown)
    return shown[0] + ("" if any(rec for _, rec in values) or shown[0] == UNRECORDED else " (default)")


def config_table(labels: list[str], analyses: list[Analysis],
                 defaults: Callable[[str], Mapping[str, str]] | None = None) -> Table:
    """What differs between the comparisons' configurations, by resolved value: a setting a run did not record (a
    field added to pobench since) counts as its default (``defaults(objective)``, see :func:`_resolved`), and a row is
    listed only where the values differ. Run-level settings are compared over all runs; an objective's own fields
    (``objective.*``) only for the objectives (variants) both comparisons ran, since an objective one of them lacks
    is a different objective set (the ``objectives`` row), not a changed setting."""
    def run_level(k: str) -> bool:
        return k.split(".")[0] not in PER_RUN_PARAMS and not k.startswith(OBJECTIVE_FIELD)

    # ("tags.x": a run's tags flattened into its params, per run)
    keys = {k for a in analyses for r in a.comparison.runs for k in r.params if run_level(k)}
    settings = []
    for a in analyses:
        res = _resolved(a.comparison.runs, keys, defaults)
        res["engine"] = {(r.tags.get(ENGINE_TAG) or r.params.get("engine", "native"), True) for r in a.comparison.runs}
        settings.append(res)
    unknown: list[str] = []

    def differ(k: str, sides: list[set[tuple[str, bool]]]) -> bool:
        """Whether the comparisons resolve ``k`` to different values (one known to none of them: noted, not
        compared)."""
        values = [frozenset(v for v, _ in side) for side in sides]
        if len(set(values)) == 1:
            return False
        if any(UNRECORDED in v for v in values):
            unknown.append(k)
            return False
        return True

    rows = []
    for k in sorted(set().union(*settings)):
        sides = [s[k] for s in settings]
        if differ(k, sides):
            rows.append([k, *[_cell(side) for side in sides]])
    # an objective's own fields, per variant every comparison ran; equal changes joined: "objective.kl_coef (grpo,
    # dapo)"
    common = [o for o in analyses[0].comparison.objectives if all(o in a.comparison.objectives for a in analyses)]
    by_change: dict[tuple, list[str]] = {}
    for o in common:
        runs = [[r for r in a.comparison.runs if r.variant == o] for a in analyses]
        fields = {k for rs in runs for r in rs for k in r.params if k.startswith(OBJECTIVE_FIELD)}
        per = [_resolved(rs, fields, defaults) for rs in runs]
        for k in sorted(fields):
            sides = [p[k] for p in per]
            if differ(f"{k} ({o})", sides):
                by_change.setdefault((k, *[_cell(side) for side in sides]), []).append(o)
    rows += [[f"{k} ({', '.join(objs)})", *cells] for (k, *cells), objs in by_change.items()]
    only = {o: [lab for lab, a in zip(labels, analyses) if o in a.comparison.objectives]
            for a in analyses for o in a.comparison.objectives if o not in common}
    head = [["objectives", *[", ".join(a.comparison.objectives) for a in analyses]],
            ["seeds", *[", ".join(map(str, sorted({r.seed for r in a.comparison.runs}))) for a in analyses]],
            ["experiment", *[a.comparison.experiment for a in analyses]],
            ["baseline", *[a.baseline or ABSENT for a in analyses]]]
    caption = (f"What differs: the objectives, seeds, experiment and baseline of each comparison, then every setting "
               f"whose resolved value differs ({len(rows)}): the value its runs recorded, or \"(default)\" where "
               f"none did (a field pobench added since); \"varies between its runs\" where the runs of one "
               f"comparison differ. Per-run fields (the seed, the run name, ...) are left out. An objective's own "
               f"fields (objective.*) are compared for the objectives both comparisons ran "
               f"({', '.join(common) or 'none'}), and listed with them.")
    if only:
        caption += (" Objectives in only some of the comparisons (" + "; ".join(
            f"{o}: {', '.join(labs)}" for o, labs in only.items()) + ") make a different objective set: their "
                    "fields are not compared, nor listed as changed settings.")
    if unknown:
        caption += (" Recorded by only some comparisons, with no default known here, so not compared: "
                    + ", ".join(unknown) + ".")
    return Table("compare_config", "What differs between the comparisons", caption, ["field", *labels], head + rows,
                 ["field", *labels], head + rows)


def compare_comparisons(specs: list[tuple[str, str]], tracking_uri: str | None = None, *,
                        out_root: str | Path = "reports/out", baseline: str | None = None,
                        target_acc: float | None = None, options: ReportOptions | None = None,
                        defaults: Callable[[str], Mapping[str, str]] | None = None, client=None) -> CompareResult:
    """Analyse each comparison as its report does and write the side-by-side tables; ``defaults(objective)``: the
    params a run of that objective records with every default (``bench compare`` passes pobench's own), so a setting
    a run did not record is compared by its default (:func:`config_table`)."""
    from reports.edits import check_unedited
    from reports.evals import load_evals
    from reports.load import load_comparison
    from reports.paths import contained, make_owned, new_temp_folder, remove_owned, replace_owned, safe_component
    from reports.record import BASELINE, open_client
    from reports.record import tracking_uri as resolve_uri
    from reports.report import analyse, comparison_run, report_folder

    options = options or ReportOptions()
    if len(specs) < 2:
        raise ValueError("give at least two comparisons")
    if len(set(specs)) < len(specs):
        raise ValueError("a comparison is named twice; name each once")
    exp_dir = report_folder(out_root, specs[0][0])
    dest = contained(out_root, exp_dir.name, safe_component("compare-" + "-".join(c for _, c in specs),
                                                            "comparison ids"))
    check_unedited(dest, "the folder")  # a file of it the user edited: one line before any work, not replaced (H14)
    uri = resolve_uri(tracking_uri)
    client = client or open_client(uri)
    analyses, labels = [], []
    for exp, cid in specs:
        cmp = load_comparison(exp, cid, uri, client=client)
        crun = comparison_run(client, cmp)
        recorded = crun.data.tags.get(BASELINE) if crun is not None else None
        base = baseline if baseline in cmp.objectives else None
        analyses.append(analyse(cmp, baseline=base, recorded_baseline=recorded, target_acc=target_acc,
                                units=options.units, evals=load_evals(client, cmp)))
        labels.append(cid if len({e for e, _ in specs}) == 1 else f"{exp}:{cid}")
    if baseline is not None and not any(a.baseline == baseline for a in analyses):
        raise ValueError(f"--baseline {baseline!r} is in none of the comparisons")
    tables = {"compare_config": config_table(labels, analyses, defaults)}
    for name in SIDE_BY_SIDE:
        t = side_by_side(name, labels, [a.tables.get(name) for a in analyses])
        if t is not None:
            tables[t.name] = t
    make_owned(dest.parent, "reports")
    tmp = new_temp_folder(dest)
    try:
        for t in tables.values():
            t.write(tmp)
        (tmp / "compare.md").write_text(_markdown(labels, analyses, tables))
        replace_owned(tmp, dest, out_root)
    finally:
        if tmp.exists():
            remove_owned(tmp, out_root)
    return CompareResult(dest, labels, analyses, tables)


def _markdown(labels: list[str], analyses: list[Analysis], tables: dict[str, Table]) -> str:
    lines = [f"# Comparisons {' vs '.join(f'`{lab}`' for lab in labels)}\n"]
    for lab, a in zip(labels, analyses):
        cmp = a.comparison
        lines.append(f"- `{lab}`: {len(cmp.runs)} runs, config hash `{cmp.config_hash}`, baseline {a.baseline}, "
                     f"target {a.target_how if a.target is not None else 'none (' + a.target_how + ')'}; "
                     f"{a.interval}.")
        if cmp.missing:
            lines.append(f"  - {missing_note(cmp)}")
        lines += [f"  - {n}" for n in cmp.odd]
    lines.append("")
    for t in tables.values():
        lines.append(f"### {t.title}\n\n{t.markdown()}\n{t.caption} ([CSV]({t.name}.csv), [LaTeX]({t.name}.tex))\n")
    return "\n".join(lines)
