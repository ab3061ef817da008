"""Every plotted series of a comparison as one tidy table (``curves.csv``, and ``curves.parquet`` when pyarrow is
installed), so a figure can be redrawn or restyled from the file alone.

One row per (run, metric, step): ``comparison, objective, seed, run_id, step, elapsed_s, cpu_s, tokens, metric,
value, unit``. ``value`` is what the figures plot: an accuracy (``reports.metric_keys.domain``) in the report's unit
(``unit`` = ``%`` by default, ``fraction`` with ``--fractions``: ``reports.tables.Units``), every other metric as
logged (``unit`` = ``as logged``; docs/METRICS.md gives it). ``objective`` is the label the report groups by (the
variant); ``elapsed_s`` is the run's training wall-clock at that step (``time/elapsed_s``; 0 at step 0, empty where
the run logged none); ``cpu_s`` the training process's CPU seconds there (``time/cpu_s``, the same way); ``tokens``
the completion tokens the run has sampled up to that step (cumulative ``rollout/gen_tokens``; 0 at step 0, empty where
a step is missing). The figures plot the seed mean of ``value`` per (objective, step) — against ``step``,
``elapsed_s``, ``cpu_s`` or ``tokens``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from reports import metric_keys as K
from reports.derived import KEY_CPU, KEY_ELAPSED, cumulative
from reports.tables import Units

KEY_TOKENS = K.GEN_TOKENS
COLUMNS = ["comparison", "objective", "seed", "run_id", "step", "elapsed_s", "cpu_s", "tokens", "metric", "value",
           "unit"]


def elapsed_at(run, step: int) -> float | None:
    """Training wall-clock seconds of ``run`` at ``step`` (0 at step 0; None when it logged no time there)."""
    if step == 0:
        return 0.0
    return dict(run.series.get(KEY_ELAPSED, [])).get(step)


def cpu_at(run, step: int) -> float | None:
    """The training process's CPU seconds of ``run`` at ``step`` (0 at step 0; None when it logged none there)."""
    if step == 0:
        return 0.0
    return dict(run.series.get(KEY_CPU, [])).get(step)


def cumulative_tokens(run) -> dict[int, float]:
    """Step -> completion tokens ``run`` sampled in steps 1..step, for step 0 up to the first step it did not log."""
    return dict(cumulative(run.series.get(KEY_TOKENS, [])))


def tokens_at(run, step: int) -> float | None:
    """Completion tokens ``run`` sampled in steps 1..``step`` (None when one of those steps is not logged)."""
    return cumulative_tokens(run).get(step)


def curve_rows(cmp, keys: Iterable[str], units: Units | None = None) -> list[list]:
    """The rows of :data:`COLUMNS` for every run of the comparison and every key it logged (accuracies in
    ``units``, percent by default)."""
    units = units or Units()
    rows = []
    for r in cmp.runs:
        tokens = cumulative_tokens(r)
        elapsed = {0: 0.0, **{int(s): float(v) for s, v in r.series.get(KEY_ELAPSED, [])}}
        cpu = {0: 0.0, **{int(s): float(v) for s, v in r.series.get(KEY_CPU, [])}}
        for key in keys:
            f, unit = units.factor(key), units.unit_of(key)
            for step, value in r.series.get(key, []):
                rows.append([cmp.comparison_id, r.variant, r.seed, r.run_id, int(step), elapsed.get(int(step)),
                             cpu.get(int(step)), tokens.get(int(step)), key,
                             float(value) if f == 1 else round(float(value) * f, 10), unit])  # (62.25, not 62.2500001)
    return rows


def curves_frame(cmp, keys: Iterable[str], units: Units | None = None):
    """The curves as a pandas DataFrame (one row per run, metric and step)."""
    import pandas as pd

    return pd.DataFrame(curve_rows(cmp, list(keys), units), columns=COLUMNS)


def write_curves(cmp, keys: Iterable[str], out_dir: Path, units: Units | None = None) -> list[Path]:
    """``curves.csv`` (and ``curves.parquet`` when pyarrow is installed) in ``out_dir``."""
    df = curves_frame(cmp, keys, units)
    paths = [out_dir / "curves.csv"]
    df.to_csv(paths[0], index=False)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return paths
    paths.append(out_dir / "curves.parquet")
    df.to_parquet(paths[1], index=False)
    return paths
