"""A comparison as pandas DataFrames, for a notebook: the numbers of its report without writing anything.

    from reports.frames import load_frames

    f = load_frames("pobench")                      # the experiment's most recent comparison (or comparison="c...")
    f.runs                                          # one row per run: objective, seed, every derived number
    f.tables["paired_test"]                         # every table of the report, numbers as fractions
    acc = f.curves[f.curves.metric == "eval/accuracy"]  # as curves.csv: accuracies in % (units=Units(False))
    acc.pivot_table(index="step", columns="objective", values="value").plot()   # seed means per step

It reads MLflow only (``load_comparison``) and computes what ``bench report`` computes (``reports.report.analyse``):
the same baseline rule, target, derived numbers and tables.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from reports.report import Analysis
from reports.tables import Units


@dataclass
class Frames:
    """One comparison as DataFrames (see the module docstring)."""

    runs: Any          # pandas.DataFrame: run_id, run, objective, registered, seed, status, derived numbers
    curves: Any        # pandas.DataFrame: comparison, objective, seed, run_id, step, elapsed_s, tokens, metric, value,
    #                    unit (accuracies in the report's unit, as curves.csv)
    tables: dict       # table name -> pandas.DataFrame (the CSV columns of the report's tables)
    evals: Any         # pandas.DataFrame: run_id, objective, seed, benchmark, eval_key, metric, value (bench eval)
    analysis: Analysis


def load_frames(experiment: str = "pobench", comparison: str | None = None, tracking_uri: str | None = None, *,
                baseline: str | None = None, target_acc: float | None = None, metrics: tuple[str, ...] = (),
                units: Units | None = None, client=None) -> Frames:
    """Load comparison ``comparison`` (default: the experiment's most recent) of ``experiment`` into DataFrames.
    ``metrics``: more logged metric keys to include in ``curves``; ``units``: the accuracy unit of ``curves`` (percent,
    as ``bench report``; ``Units(percent=False)``: fractions)."""
    import pandas as pd

    from reports.curves import curves_frame
    from reports.evals import load_evals
    from reports.load import load_comparison
    from reports.plots import plotted_keys
    from reports.record import BASELINE
    from reports.report import analyse, comparison_run

    cmp = load_comparison(experiment, comparison, tracking_uri, client=client, extra_keys=metrics)
    if client is None:
        from reports.record import open_client

        client = open_client(cmp.tracking_uri)
    crun = comparison_run(client, cmp)
    evals = load_evals(client, cmp)
    a = analyse(cmp, baseline=baseline, target_acc=target_acc, evals=evals, units=units,
                recorded_baseline=crun.data.tags.get(BASELINE) if crun is not None else None)
    runs = pd.DataFrame([{"run_id": r.run_id, "run": r.name, "objective": r.variant, "registered": r.objective,
                          "seed": r.seed, "status": r.status, **{k: v for k, v in asdict(a.derived[r.run_id]).items()
                                                                 if k != "spike_at"}} for r in cmp.runs])
    by_id = {r.run_id: r for r in cmp.runs}
    ev = pd.DataFrame([{"run_id": e.parent, "objective": by_id[e.parent].variant, "seed": by_id[e.parent].seed,
                        "benchmark": e.benchmark, "eval_key": e.key, "metric": e.metric, "value": e.value}
                       for e in evals if e.metric is not None],
                      columns=["run_id", "objective", "seed", "benchmark", "eval_key", "metric", "value"])
    return Frames(runs, curves_frame(cmp, plotted_keys(tuple(metrics)), units),
                  {name: t.frame() for name, t in a.tables.items()}, ev, a)
