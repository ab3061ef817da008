"""The report's "what differs under this configuration" table: the distinguishability probe (``algorithms.probe``)
run on the comparison's objectives under the regime its runs trained in, computed from the runs' MLflow params and
tags (objective, overrides, update_epochs, minibatches, lr, batch sizes) and their measured drift
(``train/abs_log_ratio``), so the report needs nothing but MLflow and ``algorithms``."""

from __future__ import annotations

import json

from algorithms.probe import ProbeResult, Regime, probe
from reports import metric_keys as K
from reports.load import Comparison
from reports.record import OVERRIDES
from reports.tables import Table

LOOP_FIELDS = ("update_epochs", "minibatches", "lr", "prompts_per_step", "group_size", "micro_batch_size",
               "max_new_tokens")
DRIFT_KEY = K.ABS_LOG_RATIO


def measured_drift(cmp: Comparison) -> float | None:
    """Mean |log r| per token per optimizer step since sampling, from the runs' ``train/abs_log_ratio`` (the mean
    over a step's mini-batches, which average (μ·M − 1)/2 prior updates); None when not logged or on-policy."""
    p = cmp.runs[0].params
    k = int(p.get("update_epochs", 1)) * int(p.get("minibatches", 1)) - 1
    values = [v for r in cmp.runs for _, v in r.series.get(DRIFT_KEY, [])]
    if k <= 0 or not values:
        return None
    return (sum(values) / len(values)) / (k / 2)


def probe_comparison(cmp: Comparison) -> tuple[ProbeResult | None, str]:
    """The probe under the comparison's regime, or (None, why not)."""
    p = cmp.runs[0].params
    missing = [f for f in LOOP_FIELDS if f not in p]
    if missing:
        return None, f"the runs do not record {', '.join(missing)}"
    regime = Regime.from_loop(**{f: (float(p[f]) if f == "lr" else int(p[f])) for f in LOOP_FIELDS},
                              log_ratio_per_update=measured_drift(cmp))
    entries, seen = [], set()
    for r in cmp.runs:
        if r.variant in seen:
            continue
        seen.add(r.variant)
        entries.append((r.variant, r.objective, json.loads(r.tags.get(OVERRIDES) or "{}")))
    try:
        return probe(entries, regime), ""
    except ValueError as e:  # an objective this checkout no longer registers
        return None, str(e)


def probe_table(cmp: Comparison) -> tuple[Table, list[str]]:
    """The table and the warnings (coinciding groups, inert terms) for the report's notes."""
    res, why = probe_comparison(cmp)
    cols = list(ProbeResult.HEADER)
    if res is None:
        return Table("distinguishability", "What differs under this configuration",
                     f"Distinguishability probe not run: {why}.", cols, [], cols, []), []
    caption = (f"Distinguishability probe (docs/objectives.md): gradients of each objective's loss w.r.t. per-token "
               f"log-probs and entropies on {res.tokens} synthetic completion tokens of this configuration's most "
               f"off-policy micro-batch: {res.regime.describe()}. Same gradient: relative L2 difference < "
               f"{res.tolerance:g} (such objectives cannot differ in any curve); clip binds: fraction of tokens whose "
               f"gradient each clip side removes; inert terms: a coefficient whose term leaves the gradient "
               f"unchanged, a clip that never binds, a selection of at most one token, an ablation with the same "
               f"gradient.")
    rows = res.rows()
    return Table("distinguishability", "What differs under this configuration", caption, cols, rows, cols,
                 rows), res.warnings()
