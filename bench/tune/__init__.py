"""Optuna hyper-parameter searches over one objective's tunable fields: the library behind `bench tune`
(the CLI is ``bench/cli/tune.py``; docs/TUNING.md).

A study searches the fields of an objective config (``algorithms/``) whose dataclass field carries
``metadata["search"] = (low, high, log)``; one trial trains the same base ``TrainConfig`` once per seed with the
sampled ``objective_overrides`` through ``bench.engines.entry.train`` and scores it by a held-out metric.

=================  ===================================================================================================
``space``          search-space grammar: declared ranges, ``--space`` (``Range``, ``resolve_space``)
``metric``         metric grammar: ``--metric`` / ``--direction``: a seed's value (``trial_value``)
``storage``        Optuna storage URL, heartbeats and re-queueing, pruner, trial counts (``open_storage``)
``spec``           what one worker needs (``TuneSpec``)
``study``          the study loop: create / join / resume, trials, pruning reports (``run_study``)
``runs``           MLflow bookkeeping: parent run per study, nested run per trial (``StudyRuns``)
``outputs``        best.yaml, summary and importance tables, plots, leaderboard, ``--show`` (``write_outputs``)
``confirm``        the best trial against the default on fresh seeds, confirm.md / .csv (``run_confirm``)
=================  ===================================================================================================
"""

from bench.tune.confirm import ConfirmStopped, ConfirmSummary, check_seeds, run_confirm, summarize, write_confirm
from bench.tune.metric import TuneMetric, check_reported, parse_metric, trial_value
from bench.tune.outputs import Importance, best_params_yaml, importances, leaderboard, print_leaderboard, write_outputs
from bench.tune.runs import StudyRuns, log_outputs
from bench.tune.space import Range, declared_space, objective_config, parse_space, resolve_space
from bench.tune.spec import TuneSpec
from bench.tune.storage import (
    DEFAULT_DIR,
    FINISHED,
    check_default_dir,
    check_kept,
    count,
    default_storage_url,
    make_pruner,
    open_storage,
    redact,
)
from bench.tune.study import check_new_study, open_study, run_study, seed_config
from bench.tune.workers import StudyStopped, check_worker_settings, run_workers

__all__ = [
    "DEFAULT_DIR", "FINISHED", "ConfirmStopped", "ConfirmSummary", "Importance", "Range", "StudyRuns", "StudyStopped",
    "TuneMetric", "TuneSpec", "best_params_yaml", "check_seeds", "count", "declared_space", "default_storage_url",
    "importances", "leaderboard", "log_outputs", "make_pruner", "objective_config", "open_storage", "open_study",
    "check_default_dir", "check_kept", "check_new_study",
    "check_reported", "parse_metric", "parse_space", "print_leaderboard", "redact", "resolve_space", "run_confirm",
    "run_study",
    "check_worker_settings", "run_workers", "seed_config", "trial_value", "summarize", "write_confirm", "write_outputs",
]
