"""`bench compare A B`: stored comparisons side by side (the native loop vs ``--engine trl``, 10 vs 40 steps, ...).

Each comparison is analysed exactly as `bench report` analyses it (``reports.report.analyse``: its own baseline
rule, convergence target and statistics); every per-objective table of the report is then laid out with one column
group per comparison, rows matched by objective. ``compare_config`` lists what differs between their configurations
(the runs' MLflow params, except those that differ between the runs of one comparison, and the engine). Written into
``<out_root>/<experiment of the first>/compare-<A>-<B>/`` (``compare.md`` and each table as .md / .tex / .csv),
swapped in like a report folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reports.report import Analysis, ReportOptions
from reports.tables import Table

SIDE_BY_SIDE = ("accuracy", "aggregates", "paired_test", "convergence", "stability", "benchmarks")
PER_RUN_PARAMS = {"algo", "seed", "run_name", "comparison", "output_dir", "resume", "objective_overrides",
                  "tracking_uri", "experiment", "tags", "control"}
ABSENT = "–"  # an objective a comparison does not have


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


def config_table(labels: list[str], analyses: list[Analysis]) -> Table:
    """What differs between the comparisons' configurations (and their objectives, seeds and runs)."""
    params = []
    for a in analyses:
        runs = a.comparison.runs
        shared = {k: v for k, v in runs[0].params.items()  # ("tags.x": a run's tags flattened into its params)
                  if k.split(".")[0] not in PER_RUN_PARAMS and all(r.params.get(k) == v for r in runs)}
        shared["engine"] = runs[0].tags.get("pobench.engine", shared.get("engine", "native"))
        params.append(shared)
    keys = sorted(set().union(*params))
    differ = [k for k in keys if len({p.get(k, ABSENT) for p in params}) > 1]
    rows = [["objectives", *[", ".join(a.comparison.objectives) for a in analyses]],
            ["seeds", *[", ".join(map(str, sorted({r.seed for r in a.comparison.runs}))) for a in analyses]],
            ["experiment", *[a.comparison.experiment for a in analyses]],
            ["baseline", *[a.baseline or ABSENT for a in analyses]],
            *[[k, *[p.get(k, ABSENT) for p in params]] for k in differ]]
    caption = (f"What differs: the objectives, seeds, experiment and baseline of each comparison, then every "
               f"configuration field whose value differs ({len(differ)} of the {len(keys)} recorded; fields that "
               f"differ between the runs of one comparison, such as the seed, are left out).")
    return Table("compare_config", "What differs between the comparisons", caption, ["field", *labels], rows,
                 ["field", *labels], rows)


def compare_comparisons(specs: list[tuple[str, str]], tracking_uri: str | None = None, *,
                        out_root: str | Path = "reports/out", baseline: str | None = None,
                        target_acc: float | None = None, options: ReportOptions | None = None,
                        client=None) -> CompareResult:
    from reports.evals import load_evals
    from reports.load import load_comparison
    from reports.paths import contained, make_owned, new_temp_folder, remove_owned, replace_owned, safe_component
    from reports.record import BASELINE, open_client
    from reports.record import tracking_uri as resolve_uri
    from reports.report import analyse, comparison_run, report_folder

    options = options or ReportOptions()
    if len(specs) < 2:
        raise ValueError("bench compare: give at least two comparisons")
    if len(set(specs)) < len(specs):
        raise ValueError("bench compare: a comparison is named twice")
    exp_dir = report_folder(out_root, specs[0][0])
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
    tables = {"compare_config": config_table(labels, analyses)}
    for name in SIDE_BY_SIDE:
        t = side_by_side(name, labels, [a.tables.get(name) for a in analyses])
        if t is not None:
            tables[t.name] = t
    dest = contained(out_root, exp_dir.name, safe_component("compare-" + "-".join(c for _, c in specs),
                                                            "comparison ids"))
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
    lines.append("")
    for t in tables.values():
        lines.append(f"### {t.title}\n\n{t.markdown()}\n{t.caption} ([CSV]({t.name}.csv), [LaTeX]({t.name}.tex))\n")
    return "\n".join(lines)
