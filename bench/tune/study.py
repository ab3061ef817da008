"""The study loop of `bench tune`: create or join a study, run trials until it holds enough finished ones.

One trial trains the same base ``TrainConfig`` once per seed with the sampled ``objective_overrides`` through
``bench.engines.train`` and scores it by ``bench.tune.metric``. Pruning: each held-out evaluation reports the eval
metric to Optuna (sign-flipped for the ``*_to`` metrics, so that "lower is better" holds for both the study and its
curves) at step ``seed_index * (steps + 1) + train_step``: all trials use the same seed list, so the pruner compares
like with like. Several workers may run one study against one storage (``bench.tune.storage``); a rerun resumes it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from bench import engines, stop
from bench.config import TrainConfig
from bench.engines import StopTraining, TrainingDiverged
from bench.tune.metric import TuneMetric, score
from bench.tune.runs import StudyRuns
from bench.tune.spec import TuneSpec
from bench.tune.storage import FINISHED, count, default_storage_url, make_pruner, open_storage, redact
from reports import metric_keys as K
from reports.record import STUDY, TRIAL, retry_locked, tracking_uri


def open_study(spec: TuneSpec) -> tuple[optuna.Study, StudyRuns]:
    """Create or join the study (checking its settings match) and its MLflow parent run."""
    # the storage is checked first: an unreachable URL fails before MLflow is touched. The stale-trial callback only
    # runs once trials are looked at (run_study), by then `runs` is assigned
    storage = open_storage(spec.storage or default_storage_url(), spec.heartbeat, spec.grace, spec.max_retry,
                           on_stale=lambda study, trial: runs.close_stale_trial(study, trial))
    runs = StudyRuns(tracking_uri(spec.base.tracking_uri), spec.base.experiment, spec.study)
    sampler = optuna.samplers.TPESampler(seed=spec.sampler_seed)
    pruner = make_pruner(spec.pruner, spec.pruner_warmup, spec.pruner_startup)
    try:
        study = optuna.create_study(storage=storage, study_name=spec.study, direction=spec.metric.direction,
                                    sampler=sampler, pruner=pruner)
        for k, v in spec.fingerprint().items():
            study.set_user_attr(k, v)
        runs.create_parent(study, spec)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=spec.study, storage=storage, sampler=sampler, pruner=pruner)
        _check_fingerprint(study, spec)
        runs.join_parent(study, spec)
    return study, runs


def _check_fingerprint(study: optuna.Study, spec: TuneSpec) -> None:
    deadline = time.monotonic() + 30  # the creating worker writes its attributes right after creating the study
    while not study.user_attrs.get("algo") and time.monotonic() < deadline:
        time.sleep(0.5)
    mine = spec.fingerprint()
    diff = [f"{k}: study has {study.user_attrs.get(k)!r}, this command {v!r}" for k, v in mine.items()
            if k in study.user_attrs and study.user_attrs[k] != v]
    if diff:
        raise ValueError(f"study {spec.study!r} exists with different settings ({'; '.join(diff)}); rerun with the "
                         f"same settings to resume it, or pick another --study name")


class _QuietWhileStopping(logging.Filter):
    """Optuna logs a trial that Ctrl-C / SIGTERM stopped as a failure, with its traceback; once a stop signal came
    (``bench.stop``) the trial is queued again and the command says so in one line, so those records are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return stop.received() is None


def run_study(spec: TuneSpec, train_fn: Callable[..., Any] | None = None,
              log: Callable[[str], None] = print, worker: str | None = None) -> optuna.Study:
    """Run trials of ``spec.study`` until it holds ``spec.trials`` finished (complete or pruned) trials.

    Safe to run from several processes / machines at once against one storage; a rerun resumes the study.
    ``train_fn`` (default ``spec.train_fn``, else ``bench.engines.train``) trains one config:
    ``train_fn(cfg, on_eval=...) -> TrainResult``.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optimize_log = logging.getLogger("optuna.study._optimize")  # (the logger of Optuna's "Trial N failed")
    if not any(isinstance(f, _QuietWhileStopping) for f in optimize_log.filters):
        optimize_log.addFilter(_QuietWhileStopping())
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    study, runs = open_study(spec)  # an unreachable storage fails here, before any training
    train_fn = train_fn or spec.train_fn or engines.train

    optuna.storages.fail_stale_trials(study)  # re-queue trials of workers that died since the last run
    log(f"study {spec.study!r} at {redact(spec.storage or default_storage_url())}: "
        f"{count(study, *FINISHED)}/{spec.trials} trials finished; MLflow parent run {runs.parent_id}")

    def objective(trial: optuna.Trial) -> float:
        if worker is not None:  # which worker of a `bench tune --workers N` ran it (Optuna user attribute)
            trial.set_user_attr("worker", worker)
        params = {name: rng.suggest(trial, name) for name, rng in spec.space.items()}
        run_id = runs.start_trial(trial, params, spec)

        def report(value: float, step: int) -> bool:
            """One evaluation of the trial, to the pruner and the trial's MLflow run; True: prune it."""
            trial.report(value, step)
            runs.log_intermediate(run_id, value, step)
            return trial.should_prune()

        curves: list[dict[int, dict[str, float]]] = []
        finals: list[float] = []
        try:
            for si, seed in enumerate(spec.seeds):
                curve: dict[int, dict[str, float]] = {}
                curves.append(curve)
                cfg = seed_config(spec, params, seed, trial.number, run_id)
                if _train_one(cfg, spec.metric, train_fn, curve, report, step_offset=si * (spec.base.steps + 1)):
                    runs.end_trial(run_id, "PRUNED", curves, None, spec)
                    raise optuna.TrialPruned(f"pruned at seed {seed}")
                finals.append(score(spec.metric, curve, spec.base.steps))
            value = float(sum(finals) / len(finals))
            runs.end_trial(run_id, "COMPLETE", curves, value, spec)
            return value
        except optuna.TrialPruned:
            raise
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM: its parameters are queued again (first: what a rerun needs),
            # (both workers stopped at once write to a SQLite storage together: retried while it is locked)
            retry_locked(study.enqueue_trial, params, user_attrs={"origin_trial": trial.user_attrs["origin_trial"]})
            runs.end_trial(run_id, "FAIL", curves, None, spec, reason="interrupted")  # and the trial ends FAIL
            raise
        except BaseException as e:
            runs.end_trial(run_id, "FAIL", curves, None, spec, reason=f"{type(e).__name__}: {e}"[:500])
            raise

    def after(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        val = "-" if trial.value is None else f"{trial.value:.4g}"
        log(f"trial {trial.number}: {trial.state.name} value={val} params={trial.params}")
        runs.log_progress(study, trial)
        if _done(study, spec):
            study.stop()

    while not _done(study, spec):
        study.optimize(objective, callbacks=[after], catch=(TrainingDiverged,), gc_after_trial=True)
        optuna.storages.fail_stale_trials(study)  # a dead worker's trial found at the end is re-queued and run
    runs.finish_parent(study, spec, complete=_done(study, spec))
    return study


def _done(study: optuna.Study, spec: TuneSpec) -> bool:
    """Enough finished trials and none re-queued; or too many genuine failures to go on."""
    if count(study, TrialState.FAIL) >= max(3, spec.trials) + spec.max_retry:
        return True
    return count(study, *FINISHED) >= spec.trials and count(study, TrialState.WAITING) == 0


def seed_config(spec: TuneSpec, params: dict[str, Any], seed: int, trial_number: int,
                trial_run_id: str) -> TrainConfig:
    """The training config of one seed of a trial; its MLflow run is nested under the trial's run."""
    base = spec.base
    return dataclasses.replace(
        base, algo=spec.algo, objective_overrides={**base.objective_overrides, **params}, seed=seed,
        run_name=f"{spec.study}-t{trial_number}-s{seed}", tracking_uri=tracking_uri(base.tracking_uri), resume=False,
        tags={**base.tags, "mlflow.parentRunId": trial_run_id, STUDY: spec.study,
              TRIAL: str(trial_number)})


def _train_one(cfg: TrainConfig, metric: TuneMetric, train_fn: Callable[..., Any],
               curve: dict[int, dict[str, float]], report: Callable[[float, int], bool], step_offset: int) -> bool:
    """Train one seed, recording every evaluation in ``curve`` and passing it to ``report(value, step_offset +
    step)``; True if ``report`` asked to prune (training then stops early)."""
    pruned = False
    t0: float | None = None

    def on_eval(step: int, metrics: dict[str, float]) -> None:
        nonlocal pruned, t0
        now = time.monotonic()
        if t0 is None:
            t0 = now
        m = dict(metrics)
        m.setdefault(K.ELAPSED_S, now - t0)
        curve[int(step)] = m
        if metric.key not in m:
            raise ValueError(f"--metric {metric.spec}: the evaluation reports no {metric.key!r}; it "
                             f"reports {', '.join(sorted(metrics))}")
        if report(metric.intermediate(float(m[metric.key])), step_offset + int(step)):
            pruned = True
            raise StopTraining(f"pruned by Optuna at step {step}")

    result = train_fn(cfg, on_eval=on_eval)
    if pruned and not getattr(result, "stopped_early", True):  # the engine could not stop (verl hands evaluations
        pruned = False  # over after its job ended): the run is complete, and so is the trial
    final = getattr(result, "final_eval", None) or {}
    if final and not pruned:
        last = max(curve) if curve else int(getattr(result, "steps_done", cfg.steps))
        curve.setdefault(last, {}).update({k: v for k, v in final.items() if k not in curve.get(last, {})})
    return pruned
