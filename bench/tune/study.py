"""The study loop of `bench tune`: create or join a study, run trials until it holds enough finished ones.

One trial trains the same base ``TrainConfig`` once per seed with the sampled ``objective_overrides`` through
``bench.engines.entry.train`` and scores it by ``bench.tune.metric``. Pruning: each held-out evaluation reports the eval
metric to Optuna (sign-flipped for the ``*_to`` metrics, so that "lower is better" holds for both the study and its
curves) at step ``seed_index * (steps + 1) + train_step``: all trials use the same seed list, so the pruner compares
like with like. Several workers may run one study against one storage (``bench.tune.storage``); a rerun resumes it.

A worker holds a lock file while it runs a trial, until the trial's end is written in the storage (:func:`trial_lock`,
:func:`hold_trial`; released by the kernel when its process dies), and records its host in the trial: a study opened
again finds at once the RUNNING trials of this host whose lock is free, whose process is gone (a SIGKILL, the memory
killer, or a process the lost storage stopped before the trial's end was written), and fails and re-queues them and
ends their MLflow runs FAILED (:func:`fail_dead_trials`), instead of waiting for their heartbeat to go stale. A fault
of the storage itself (the PostgreSQL server gone) ends the study: the runs this process left open and the study's
run end FAILED and the command says so in one line (:class:`~bench.engines.base.RunStopped`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from filelock import FileLock, Timeout
from optuna.trial import TrialState

from bench import faults
from bench.config import TrainConfig
from bench.engines import StopTraining, TrainingDiverged
from bench.engines import entry as engines
from bench.engines.base import RunStopped
from bench.runs import stop
from bench.runs.run import end_left_running
from bench.runs.tracking import read_run_record, store_client
from bench.tune.heap import trial_garbage_only
from bench.tune.metric import TuneMetric, trial_value
from bench.tune.runs import DEAD_REASON, StudyRuns
from bench.tune.spec import TuneSpec
from bench.tune.storage import (
    FINISHED,
    count,
    default_storage_url,
    fail_unstarted,
    make_pruner,
    open_storage,
    redact,
)
from reports import metric_keys as K
from reports.paths import lock_file, make_lock_folder
from reports.record import KIND, STUDY, TRIAL, retry_locked, sqlite_file, tracking_uri


def open_study(spec: TuneSpec) -> tuple[optuna.Study, StudyRuns]:
    """Create or join the study (checking its settings match) and its MLflow parent run."""
    # the storage is checked first: an unreachable URL fails before MLflow is touched. The stale-trial callback only
    # runs once trials are looked at (run_study), by then `runs` is assigned
    storage = open_storage(spec.storage or default_storage_url(), spec.heartbeat, spec.grace, spec.max_retry,
                           on_stale=lambda study, trial: runs.close_stale_trial(study, trial))
    runs = StudyRuns(tracking_uri(spec.base.tracking_uri), spec.base.experiment, spec.study)
    pruner = make_pruner(spec.pruner, spec.pruner_warmup, spec.pruner_startup)
    try:
        study = optuna.create_study(storage=storage, study_name=spec.study, direction=spec.metric.direction,
                                    sampler=optuna.samplers.TPESampler(seed=spec.sampler_seed), pruner=pruner)
        for k, v in spec.fingerprint().items():
            study.set_user_attr(k, v)
        runs.create_parent(study, spec)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=spec.study, storage=storage, pruner=pruner)
        _check_fingerprint(study, spec)
        held = len(study.get_trials(deepcopy=False))
        study.sampler = optuna.samplers.TPESampler(seed=resumed_seed(spec.sampler_seed, held))
        runs.join_parent(study, spec)
    return study, runs


def check_new_study(spec: TuneSpec) -> None:
    """A study this storage does not hold yet must not take the place of an earlier study of its name held in another
    storage (or in a storage since replaced): its trial run folders (``<output_dir>/<study>-t<N>-s<seed>``) would
    collide with the earlier trials' at trial 0, and its MLflow runs mix with theirs. One ValueError line naming
    both, before any study, storage file or MLflow run is created (held-out round 10, H02). A study the storage holds
    is joined / resumed as before."""
    url = spec.storage or default_storage_url()
    db = sqlite_file(url)
    if db is None or db.exists():
        if spec.study in optuna.study.get_all_study_names(open_storage(url)):
            return
    here = f"the Optuna storage {redact(url)} holds no study {spec.study!r}"
    what = ("pass --storage <that storage> to resume that study, or another --study to start a new one here "
            "(the earlier one's runs keep their names)")
    earlier = _earlier_study_run(spec)
    if earlier is not None and earlier[1] != redact(url):
        raise ValueError(f"--study {spec.study}: the MLflow run {earlier[0]} (experiment {spec.base.experiment!r}) "
                         f"holds a study of that name in another Optuna storage, {earlier[1]}, and {here}: {what}")
    for n in range(spec.trials):
        for seed in spec.seeds:
            folder = seed_config(spec, {}, seed, n, "").run_dir()
            if folder.is_dir() and any(folder.iterdir()):
                raise ValueError(f"--study {spec.study}: {folder} holds trial {n}'s run of an earlier study of that "
                                 f"name, and {here} (the earlier one ran in another storage, or this one was replaced):"
                                 f" {what}, or another --output-dir")


def _earlier_study_run(spec: TuneSpec) -> tuple[str, str] | None:
    """(run id, storage) of a study's MLflow run named ``spec.study`` in the experiment, if the store holds one (a
    local store that does not exist yet is not created)."""
    uri = tracking_uri(spec.base.tracking_uri)
    db = sqlite_file(uri)
    if db is not None and not db.exists():
        return None
    client = store_client(uri)
    experiment = client.get_experiment_by_name(spec.base.experiment)
    if experiment is None:
        return None
    for run in client.search_runs([experiment.experiment_id], f"tags.`{KIND}` = 'tune-study'", max_results=5000):
        if run.data.tags.get(STUDY) == spec.study:
            return run.info.run_id, run.data.params.get("storage", "")
    return None


def resumed_seed(seed: int | None, trials: int) -> int | None:
    """The TPE sampler's seed for a study joined holding ``trials`` trials: ``seed`` itself for an empty study (a
    fresh study samples as it always did), else one derived from both (docs/TUNING.md). Held-out round 9: a resumed
    study seeded as a fresh one proposed trial 0's parameters again (the sampler's random start replayed from its
    seed). None (no ``--sampler-seed``): random."""
    if seed is None or trials == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{trials}".encode()).digest()[:4], "big")


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


#: what a fault of the Optuna storage raises (Optuna wraps some of SQLAlchemy's errors, not all)
STORAGE_ERRORS = (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError)
HOST = "host"  # the trial's user attribute naming the host its worker runs on


class _TrialFailures(logging.Filter):
    """Optuna logs a failed trial with its traceback ("Trial N failed with parameters ... because of", then "Trial N
    failed with value None"). A trial's error that Optuna raises on (all but a diverged one) reaches the command,
    which words it once: a stop (Ctrl-C / SIGTERM: the trial is queued again), a fault of the store, the storage or
    the file system, a plugin's error, in one line; a bug by its traceback. So those two records are dropped (a fault
    was one line after Optuna's traceback: held-out round 9's leftover, an S3 place refusing a trial's files); a
    diverged trial, after which the study goes on, keeps Optuna's line without the traceback. Once a stop signal
    came, every such record is dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.raised: set[str] = set()  # "Trial N " of the records dropped, whose second line is dropped too

    def filter(self, record: logging.LogRecord) -> bool:
        if stop.received() is not None:
            return False
        failed = record.exc_info[1] if record.exc_info else None
        trial = " ".join(record.getMessage().split()[:2]) + " "
        if isinstance(failed, TrainingDiverged):
            record.exc_info, record.exc_text = None, None
        elif failed is not None:
            self.raised.add(trial)
            return False
        elif trial in self.raised and "failed with value" in record.getMessage():
            self.raised.discard(trial)
            return False
        return True


def storage_fault(error: BaseException | None) -> BaseException | None:
    """The fault of the storage behind ``error`` (itself, or one it was raised from or while handling: Optuna
    raises an ``UnboundLocalError`` of its own while handling a lost connection), else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, STORAGE_ERRORS):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def trial_lock(spec: TuneSpec, number: int) -> Path:
    """The lock file a worker holds while it runs trial ``number``: ``<output_dir>/.locks/tune-<study>-<8 hex of the
    storage and study>-t<N>.lock`` (beside the trials' run folder locks; the hex keeps two storages' studies of one
    name apart)."""
    key = hashlib.sha256(f"{redact(spec.storage or default_storage_url())}\0{spec.study}".encode()).hexdigest()[:8]
    return lock_file(spec.base.output_dir, f"tune-{spec.study}-{key}-t{number}")


def hold_trial(spec: TuneSpec, trial: optuna.Trial) -> FileLock:
    """Take trial ``trial``'s lock (its host recorded in the trial once held): held by this process until the trial's
    state is in the storage (:func:`release_trial`), so a rerun at once knows from a free lock whose file is still
    there that this process is gone with the trial RUNNING."""
    path = make_lock_folder(trial_lock(spec, trial.number))
    lock = FileLock(str(path))
    lock.acquire(timeout=30)  # (a trial number is run once: nobody else holds it)
    try:
        trial.set_user_attr(HOST, socket.gethostname())
    except BaseException:
        path.unlink(missing_ok=True)
        lock.release()
        raise
    return lock


def release_trial(lock: FileLock, written: bool) -> None:
    """Release a trial's lock; its file is removed only once the trial's end is ``written`` in the storage. (Held-out
    round 9: the file was removed as the trial's code ended, before Optuna wrote its state; the PostgreSQL server
    restarted mid-trial, so the state was never written, and the rerun took the trial, RUNNING with no lock file,
    for one another host runs: it stayed RUNNING for good.)"""
    if written:
        Path(lock.lock_file).unlink(missing_ok=True)
    lock.release()


def _release_all(study: optuna.Study, held: dict[int, tuple[int, FileLock]]) -> None:
    """Release the locks this process still holds (the trials whose code raised out of ``study.optimize``: Ctrl-C, a
    fault of the storage); a lock's file stays where the storage cannot say the trial has ended."""
    storage_ok = True
    for number, (trial_id, lock) in list(held.items()):
        written = False
        if storage_ok:
            try:
                written = study._storage.get_trial(trial_id).state != TrialState.RUNNING
            except Exception:  # noqa: BLE001  (the storage is gone: the rerun fails the trial: fail_dead_trials)
                storage_ok = False
        release_trial(lock, written)
        del held[number]


def fail_dead_trials(study: optuna.Study, spec: TuneSpec, runs: StudyRuns) -> list[int]:
    """Fail the RUNNING trials of this host whose worker process is gone (their lock free), end their MLflow runs
    FAILED and re-queue their parameters (the storage's stale-trial callback, ``--max-retry``); returns their
    numbers. Trials of other hosts, or without a lock (started by an earlier version), are left to the heartbeat."""
    storage, host, failed = study._storage, socket.gethostname(), []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        path = trial_lock(spec, trial.number)
        if trial.user_attrs.get(HOST) != host or not path.exists():
            continue
        try:
            inode = path.stat().st_ino
        except FileNotFoundError:  # its worker ended it just now
            continue
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=0)
        except Timeout:  # its worker is alive
            continue
        try:
            if os.stat(path).st_ino != inode:  # ended and removed meanwhile (the acquire made a new file)
                path.unlink(missing_ok=True)
                continue
            try:
                if not storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:  # another process failed it first
                continue
            dead = copy.deepcopy(storage.get_trial(trial._trial_id))
            runs.fail_trial(dead, DEAD_REASON)
            callback = storage.get_heartbeat_stale_trial_callback()
            if callback is not None:  # re-queued with its parameters (a second close of its runs finds them ended)
                callback(study, dead)
            path.unlink(missing_ok=True)
            failed.append(trial.number)
        finally:
            lock.release()
    return failed


UNSENT_REASON = "its process stopped while the MLflow server did not answer (its end could not be sent)"


def end_unsent_trials(study: optuna.Study, spec: TuneSpec, runs: StudyRuns) -> list[int]:
    """The trial runs a stopped process left RUNNING, the MLflow server not taking their end (held-out round 13, H07),
    whose trial the storage holds ended: the end each training run's folder recorded (``unsent_end``) is applied, as
    `bench run`'s rerun does, and the trial's run ends as its trial did; returns their numbers."""
    left = runs.left_running()
    if not left:
        return []
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    ended = []
    for number, rid in sorted(left.items()):
        state = states.get(number)
        if state is None or state in (TrialState.RUNNING, TrialState.WAITING):
            continue
        for seed in spec.seeds:
            cfg = seed_config(spec, {}, seed, number, rid)
            found = read_run_record(cfg.run_dir())
            if found is not None and isinstance(found.get("unsent_end"), dict):
                end_left_running(cfg, cfg.run_dir())  # (under its folder's lock: not while a process trains there)
        runs.end_left(rid, state, UNSENT_REASON)
        ended.append(number)
    return ended


def storage_lost(spec: TuneSpec, runs: StudyRuns, error: BaseException) -> RunStopped:
    """The one line of a study stopped by its storage (the runs this process left open and the study's run end FAILED
    first); a damaged one is said so (held-out round 14, H14: "trials kept ... once it answers again", both false)."""
    cause = error.__cause__ or error  # (Optuna's StorageInternalError says only "an exception is raised")
    first = faults.storage_damage(error) or (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
    url = redact(spec.storage or default_storage_url())
    said = runs.fail_open(f"the Optuna storage {url} {'is damaged' if faults.damaged(first) else 'failed'}: {first}")
    if faults.damaged(first):
        return RunStopped(f"the Optuna storage {url} is damaged ({first}); the study stopped and {said}; "
                          f"{faults.STORAGE_DAMAGED_ADVICE}")
    refused = faults.storage_refusal(error)
    then = f"the storage {refused}, then rerun" if refused else "once the storage answers again, rerun"
    return RunStopped(f"the Optuna storage {url} failed ({type(cause).__name__}: {first}); the study stopped, its "
                      f"finished trials are kept in the storage and {said}; {then} the same command to resume the "
                      "study")


def run_study(spec: TuneSpec, train_fn: Callable[..., Any] | None = None,
              log: Callable[[str], None] = print, worker: str | None = None) -> optuna.Study:
    """Run trials of ``spec.study`` until it holds ``spec.trials`` finished (complete or pruned) trials.

    Safe to run from several processes / machines at once against one storage; a rerun resumes the study.
    ``train_fn`` (default ``spec.train_fn``, else ``bench.engines.entry.train``) trains one config:
    ``train_fn(cfg, on_eval=...) -> TrainResult``.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optimize_log = logging.getLogger("optuna.study._optimize")  # (the logger of Optuna's "Trial N failed")
    if not any(isinstance(f, _TrialFailures) for f in optimize_log.filters):
        optimize_log.addFilter(_TrialFailures())
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    study, runs = open_study(spec)  # an unreachable storage fails here, before any training
    try:
        return _run_trials(spec, study, runs, train_fn or spec.train_fn or engines.train, log, worker)
    except Exception as e:  # the storage lost mid-study: one line, no run left RUNNING
        fault = storage_fault(e)
        if fault is None:
            raise
        raise storage_lost(spec, runs, fault) from None


def _run_trials(spec: TuneSpec, study: optuna.Study, runs: StudyRuns, train_fn: Callable[..., Any],
                log: Callable[[str], None], worker: str | None) -> optuna.Study:
    """``run_study``'s trials once the study is open."""
    fail_dead_trials(study, spec, runs)  # re-queue trials of workers killed just now (their lock free)
    end_unsent_trials(study, spec, runs)  # the runs of trials stopped while the MLflow server did not answer
    optuna.storages.fail_stale_trials(study)  # and of workers that died elsewhere since (their heartbeat stale)
    log(f"study {spec.study!r} at {redact(spec.storage or default_storage_url())}: "
        f"{count(study, *FINISHED)}/{spec.trials} trials finished; MLflow parent run {runs.parent_id}")

    held: dict[int, tuple[int, FileLock]] = {}  # number: (id, lock) of the trials whose end is not yet written
    asked: dict[int, int] = {}  # number: id of the trials this process took and has not begun to set up
    ask = study.ask

    def ask_whole(*args: Any, **kwargs: Any) -> optuna.Trial:
        with stop.uninterrupted():  # (a stop while the trial is taken comes once it is recorded here)
            trial = ask(*args, **kwargs)
            asked[trial.number] = trial._trial_id
        return trial

    study.ask = ask_whole  # type: ignore[method-assign]  (what Optuna's optimize calls for each trial)

    def objective(trial: optuna.Trial) -> float:
        # the trial set up whole (its lock, its MLflow run): a stop during it comes once it is, and queues the trial
        # again (held-out round 13, H17: a signal as its run was made left it FAIL, not queued, its run RUNNING)
        started: dict[str, Any] = {}
        try:
            with stop.uninterrupted():
                asked.pop(trial.number, None)
                if worker is not None:  # which worker of a `bench tune --workers N` ran it (Optuna user attribute)
                    trial.set_user_attr("worker", worker)
                params = {name: rng.suggest(trial, name) for name, rng in spec.space.items()}
                # a rerun at once knows from its free lock (its file kept until Optuna has written the trial's end)
                # that this process is gone: released in `after` (its end written), or by _release_all (it raised)
                held[trial.number] = (trial._trial_id, hold_trial(spec, trial))
                started["run_id"] = runs.start_trial(trial, params, spec)
        except KeyboardInterrupt:
            if "run_id" in started:
                interrupted(trial, params, started["run_id"], [])
            raise
        return trial_body(trial, params, started["run_id"])

    def interrupted(trial: optuna.Trial, params: dict[str, Any], run_id: str,
                    curves: list[dict[int, dict[str, float]]]) -> None:
        """Ctrl-C / SIGTERM: the trial's parameters queued again (first: what a rerun needs; retried while SQLite is
        locked), its run ended FAIL."""
        retry_locked(study.enqueue_trial, params, user_attrs={"origin_trial": trial.user_attrs["origin_trial"]})
        runs.end_trial(run_id, "FAIL", curves, None, spec, reason="interrupted")

    def trial_body(trial: optuna.Trial, params: dict[str, Any], run_id: str) -> float:
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
                finals.append(trial_value(spec.metric, curve, spec.base.steps))
            value = float(sum(finals) / len(finals))
            runs.end_trial(run_id, "COMPLETE", curves, value, spec)
            return value
        except optuna.TrialPruned:
            raise
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM: queued again, its run ended FAIL
            interrupted(trial, params, run_id, curves)
            raise
        except BaseException as e:
            runs.end_trial(run_id, "FAIL", curves, None, spec, reason=f"{type(e).__name__}: {e}"[:500])
            raise

    def after(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.number in held:  # (its end is written: Optuna calls this after)
            release_trial(held.pop(trial.number)[1], written=True)
        val = "-" if trial.value is None else f"{trial.value:.4g}"
        log(f"trial {trial.number}: {trial.state.name} value={val} params={trial.params}")
        runs.log_progress(study, trial)
        if _done(study, spec):
            study.stop()

    try:
        with trial_garbage_only():
            while not _done(study, spec):
                study.optimize(objective, callbacks=[after], catch=(TrainingDiverged,), gc_after_trial=True)
                fail_dead_trials(study, spec, runs)
                optuna.storages.fail_stale_trials(study)  # a dead worker's trial found at the end is re-queued, run
    except KeyboardInterrupt:
        fail_unstarted(study, asked)
        raise
    finally:
        _release_all(study, held)
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
        tags={**base.tags, "mlflow.parentRunId": trial_run_id, STUDY: spec.study, TRIAL: str(trial_number)})


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
