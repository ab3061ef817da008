"""Benchmark evaluations of a comparison's final models (``bench eval --comparison``), read back for the report.

``bench eval --comparison ID --benchmarks a,b`` logs one eval run per (training run, benchmark), nested under the
training run (``mlflow.parentRunId``) and tagged ``pobench.kind=eval``, ``pobench.benchmark`` and
``pobench.eval_key`` (:func:`settings_key` of the evaluation settings) and ``pobench.final_digest`` (the digest of the
final weights it evaluated). A FINISHED eval run with the same parent and key is a stored result: it is reused, never
recomputed, while the final weights are those it evaluated (``bench.comparison.evals``). The report's
``benchmarks`` table takes, per benchmark, the settings key that covers the most runs (the newest on a tie) and gives
each objective's mean ± 95% t interval over its seeds, with the mean and IQM over benchmarks (stratified bootstrap:
seeds resampled within each benchmark).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from reports import metric_keys as K
from reports import stats
from reports.record import BENCHMARK, EVAL_KEY, FINAL_DIGEST, KIND
from reports.tables import Table, Units

METRICS = ("greedy_acc", "pass_at_1")  # the first one an eval run has is the table's number
SHOWN_PARAMS = ("split", "limit", "k", "temperature", "max_new_tokens", "prompt_template", "seed")


def settings_key(settings: dict) -> str:
    """The hash of one benchmark's evaluation settings (benchmark, version, data source, sampling, prompt, ...)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass
class EvalRecord:
    run_id: str
    parent: str
    benchmark: str
    key: str
    start_time: int
    metrics: dict[str, float]
    params: dict[str, str] = field(default_factory=dict)

    @property
    def metric(self) -> str | None:
        return next((m for m in METRICS if K.eval_key(self.benchmark, m) in self.metrics), None)

    @property
    def value(self) -> float | None:
        m = self.metric
        return None if m is None else self.metrics[K.eval_key(self.benchmark, m)]


def find_stored(client, experiment_id: str, parent: str, key: str) -> tuple[str, str | None] | None:
    """The newest FINISHED eval run under ``parent`` with settings ``key``: (its id, the digest of the final weights
    it evaluated, None when it was stored before pobench recorded it), or None."""
    found = client.search_runs([experiment_id], filter_string=(
        f"tags.`{KIND}` = 'eval' and tags.`mlflow.parentRunId` = '{parent}' and tags.`{EVAL_KEY}` = '{key}' and "
        "attributes.status = 'FINISHED'"), order_by=["attributes.start_time DESC"], max_results=1)
    return (found[0].info.run_id, found[0].data.tags.get(FINAL_DIGEST)) if found else None


def load_evals(client, cmp) -> list[EvalRecord]:
    """Every finished benchmark eval run nested under one of the comparison's runs."""
    from reports.load import _search

    parents = {r.run_id for r in cmp.runs}
    out = []
    for r in _search(client, cmp.experiment_id, f"tags.`{KIND}` = 'eval' and attributes.status = 'FINISHED'"):
        tags = r.data.tags
        if tags.get("mlflow.parentRunId") in parents and tags.get(BENCHMARK) and tags.get(EVAL_KEY):
            out.append(EvalRecord(r.info.run_id, tags["mlflow.parentRunId"], tags[BENCHMARK], tags[EVAL_KEY],
                                  r.info.start_time or 0, dict(r.data.metrics), dict(r.data.params)))
    return out


def chosen(records: list[EvalRecord]) -> dict[str, dict[str, EvalRecord]]:
    """benchmark -> {training run id: record} under the settings key that covers the most runs (newest on a tie)."""
    by_bench: dict[str, dict[str, dict[str, EvalRecord]]] = {}
    for rec in sorted(records, key=lambda r: r.start_time):  # a later record of the same key replaces an earlier one
        if rec.value is not None:
            by_bench.setdefault(rec.benchmark, {}).setdefault(rec.key, {})[rec.parent] = rec
    out = {}
    for bench in sorted(by_bench):
        keys = by_bench[bench]
        best = max(keys, key=lambda k: (len(keys[k]), max(r.start_time for r in keys[k].values())))
        out[bench] = keys[best]
    return out


def benchmark_table(cmp, records: list[EvalRecord], units: Units) -> tuple[Table | None, list[str]]:
    """The benchmark-accuracy table (None when no run has a benchmark evaluation) and notes on what is missing."""
    picked = chosen(records)
    if not picked:
        return None, []
    notes = []
    benches = list(picked)
    groups: dict[str, list] = {}
    for r in cmp.runs:
        groups.setdefault(r.variant, []).append(r)
    rows, csv_rows = [], []
    col_values: dict[int, list] = {j: [] for j in range(2, 4 + len(benches))}
    for obj, runs in groups.items():
        cells, csv_cells, strata = [], [], []
        for j, bench in enumerate(benches, start=2):
            vals = [picked[bench][r.run_id].value for r in runs if r.run_id in picked[bench]]
            m, h = stats.mean_ci(vals)
            text = units.acc_ci(m, h)
            if vals and len(vals) < len(runs):
                text += f" (n={len(vals)})"
                notes.append(f"{bench}: {len(runs) - len(vals)} of {obj}'s {len(runs)} runs have no stored "
                             f"evaluation under the settings used (bench eval --comparison {cmp.comparison_id}).")
            cells.append(text if vals else "n/a")
            csv_cells += [m, h, len(vals)]
            col_values[j].append(m)
            strata.append(vals)
        agg = [stats.stratified_bootstrap([s for s in strata if s], st) for st in ("mean", "iqm")]
        for j, e in zip((2 + len(benches), 3 + len(benches)), agg):
            col_values[j].append(e.value)
        cells += [f"{units.acc(e.value)} {units.interval(e.low, e.high)}" for e in agg]
        rows.append([obj, str(len(runs)), *cells])
        csv_rows.append([obj, len(runs), *csv_cells, *[x for e in agg for x in (e.value, e.low, e.high)]])
    settings = []
    for bench in benches:
        rec = next(iter(picked[bench].values()))
        shown = ", ".join(f"{k} {rec.params[k]}" for k in SHOWN_PARAMS if rec.params.get(k) not in (None, "None"))
        problems = rec.metrics.get(K.EVAL_TASK_PROBLEMS.format(task=bench))
        settings.append(f"{bench}: {rec.metric}, {int(problems) if problems else '?'} problems"
                        + (f" ({shown})" if shown else ""))
    csv_cols = ["objective", "n"]
    for bench in benches:
        csv_cols += [f"{bench}_mean", f"{bench}_ci95", f"{bench}_n"]
    csv_cols += ["mean", "mean_low", "mean_high", "iqm", "iqm_low", "iqm_high"]
    t = Table("benchmarks", "Benchmark accuracy of the final models",
              f"Each final model evaluated with bench eval --comparison ({units.unit}): mean ± 95% Student-t CI over "
              "seeds per benchmark; over benchmarks: mean and interquartile mean of all (seed, benchmark) scores "
              "with a stratified-bootstrap 95% interval (seeds resampled within each benchmark). "
              + "; ".join(settings) + ". Bold: the highest mean of a column.",
              ["objective", "n", *benches, "mean over benchmarks", "IQM over benchmarks"], rows, csv_cols, csv_rows)
    for j, vals in col_values.items():
        t.emphasise(j, vals, "max")
    return t, notes
