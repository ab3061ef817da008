"""`bench run`: a comparison of objectives, (objective, seed) pairs trained under identical conditions, then its report.

- ``plan.py``: ``RunDefaults`` (bench run's defaults), objectives / params / variants, the comparison id, ``Pair``
  and the plan (reuse / resume / train);
- ``runner.py``: ``ComparisonSpec``, ``run_comparison``: the comparison's MLflow run, the pairs through an
  executor, the report;
- ``pairs.py``: one pair under its claim (``run_pair``), the shared step-0 evaluation (``initial_evals``);
- ``evals.py``: every final model of a comparison on benchmarks (`bench eval --comparison`), stored ones reused;
- ``display.py``: the live progress display;
- ``store.py``: the claim (lock file) on a pair;
- ``distinguish.py``: the distinguishability probe under a TrainConfig (the warning before training, ``probe.json``).
"""

from bench.comparison.plan import (
    DEFAULTS,
    Pair,
    RunDefaults,
    base_config,
    comparison_id,
    load_params,
    resolve_algos,
    variant_label,
)
from bench.comparison.runner import ComparisonResult, ComparisonSpec, ComparisonStopped, run_comparison

__all__ = ["DEFAULTS", "ComparisonResult", "ComparisonSpec", "ComparisonStopped", "Pair", "RunDefaults", "base_config",
           "comparison_id", "load_params", "resolve_algos", "run_comparison", "variant_label"]
