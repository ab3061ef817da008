"""MLflow bookkeeping of a study: one parent run per study (kind ``tune-study``), one nested run per trial (kind
``tune-trial``) holding its parameters, reported curve and state; each seed's training run is nested under its trial
run by the tags ``bench.tune.study`` gives it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from bench.runs.tracking import store_client, version_tags
from bench.tune.confirm import ATTR as CONFIRM_ATTR
from bench.tune.confirm import summary_of
from bench.tune.outputs import Importance, importances
from bench.tune.spec import TuneSpec
from bench.tune.storage import count, default_storage_url, redact
from reports import metric_keys as K
from reports.record import (
    BEST_TRIAL,
    BEST_VALUE,
    CONFIRM,
    CONFIRM_SEEDS,
    CONFIRM_TRIAL,
    FAIL_REASON,
    FAILURE,
    KIND,
    OBJECTIVE,
    RETRY_OF,
    STUDY,
    TRIAL,
    TRIAL_STATE,
    get_or_create_experiment,
    log_batch,
    retry_locked,
    store_lock,
    tracking_uri,
)

#: why a trial's runs were ended FAILED: its worker's heartbeat stopped; its worker's process was found gone
STALE_REASON = "worker heartbeat lost"
DEAD_REASON = "its worker process ended during the trial (killed: its trial lock was free); the trial is queued again"


def _metric(key: str, value: float, timestamp: int, step: int):
    from mlflow.entities import Metric  # (MLflow imported on first use: reports.record.mlflow_error)

    return Metric(key, value, timestamp, step)


def _tag(key: str, value: str):
    from mlflow.entities import RunTag

    return RunTag(key, value)


class StudyRuns:
    """MLflow bookkeeping of one study: a parent run and one nested run per trial.

    Uses ``MlflowClient`` only (never the fluent API), so the training loop's own active run is never disturbed.
    """

    def __init__(self, uri: str, experiment: str, study: str) -> None:
        # (each call whole: a trial stopped by a signal never leaves a write of the store half-done, holding its lock)
        self.client, self.study, self.parent_id, self.uri = store_client(uri), study, "", uri
        self.open_trials: set[str] = set()  # the trial runs this process started and has not ended
        self.experiment_id = get_or_create_experiment(self.client, uri, experiment)  # safe against other workers

    def create_parent(self, study: optuna.Study, spec: TuneSpec) -> None:
        run = self.client.create_run(self.experiment_id, run_name=f"tune-{spec.study}",
                                     tags={KIND: "tune-study", STUDY: spec.study,
                                           OBJECTIVE: spec.algo, **_version_tags()})
        self.parent_id = run.info.run_id
        params = {"algo": spec.algo, "metric": spec.metric.spec, "direction": spec.metric.direction,
                  "seeds": ",".join(map(str, spec.seeds)), "trials": spec.trials, "steps": spec.base.steps,
                  "storage": redact(spec.storage or default_storage_url()), "pruner": spec.pruner,
                  "config_hash": spec.base.comparison_hash(),
                  **{f"space.{n}": r.describe() for n, r in spec.space.items()}}
        for k, v in params.items():
            self.client.log_param(self.parent_id, k, v)
        study.set_user_attr("mlflow_parent_run_id", self.parent_id)

    def join_parent(self, study: optuna.Study, spec: TuneSpec) -> None:
        deadline = time.monotonic() + 30
        while not (pid := study.user_attrs.get("mlflow_parent_run_id")) and time.monotonic() < deadline:
            time.sleep(0.5)
        try:
            run = self.client.get_run(pid) if pid else None
        except Exception:  # a different tracking server than the creating worker's
            run = None
        if run is None:
            self.create_parent(study, spec)
            return
        self.parent_id = pid
        if run.info.status != "RUNNING":
            self.client.update_run(pid, status="RUNNING")

    def start_trial(self, trial: optuna.Trial, params: dict[str, Any], spec: TuneSpec) -> str:
        tags = {"mlflow.parentRunId": self.parent_id, KIND: "tune-trial", STUDY: spec.study,
                TRIAL: str(trial.number), OBJECTIVE: spec.algo, **_version_tags()}
        origin = trial.user_attrs.get("origin_trial")  # user attributes are copied into a re-queued trial
        if origin is None:
            trial.set_user_attr("origin_trial", trial.number)
        elif origin != trial.number:
            tags[RETRY_OF] = str(origin)
        run = self.client.create_run(self.experiment_id, run_name=f"{spec.study}-t{trial.number}", tags=tags)
        rid = run.info.run_id
        self.open_trials.add(rid)
        for k, v in params.items():
            self.client.log_param(rid, k, v)
        self.client.log_param(rid, "seeds", ",".join(map(str, spec.seeds)))
        trial.set_user_attr("mlflow_run_id", rid)
        return rid

    def log_intermediate(self, run_id: str, value: float, step: int) -> None:
        self.client.log_metric(run_id, K.TUNE_INTERMEDIATE, float(value), step=int(step))

    def end_trial(self, run_id: str, state: str, curves: list[dict[int, dict[str, float]]], value: float | None,
                  spec: TuneSpec, reason: str | None = None) -> None:
        """Log the seed-mean eval curve and the objective value, then close the run with the trial's state."""
        now = int(time.time() * 1000)
        batch = []
        for step in sorted({s for c in curves for s in c}):
            rows = [c[step] for c in curves if step in c]
            for key in sorted({k for r in rows for k in r if k.startswith("eval/")}):
                vals = [r[key] for r in rows if key in r]
                batch.append(_metric(key, float(sum(vals) / len(vals)), now, int(step)))
        if value is not None:
            batch.append(_metric(K.TUNE_OBJECTIVE, float(value), now, 0))
        tags = {TRIAL_STATE: state, **({FAIL_REASON: reason} if reason else {})}
        # (retried while SQLite is locked: on Ctrl-C / SIGTERM every worker and the driver write at once)
        retry_locked(log_batch, self.client, run_id, metrics=batch, tags=[_tag(k, v) for k, v in tags.items()])
        status = {"COMPLETE": "FINISHED", "PRUNED": "KILLED"}.get(state, "FAILED")
        retry_locked(self.client.set_terminated, run_id, status)
        self.open_trials.discard(run_id)

    def close_stale_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """A trial whose worker died (its lock free, or its heartbeat lost): mark its run, and the training run left
        open under it, FAILED."""
        self.fail_trial(trial, STALE_REASON)

    def fail_trial(self, trial: optuna.trial.FrozenTrial, reason: str) -> None:
        """The runs of a trial whose worker is gone end FAILED with ``reason``."""
        rid = trial.user_attrs.get("mlflow_run_id")
        if rid:
            self._fail_tree(rid, reason)

    def _fail_tree(self, rid: str, reason: str) -> None:
        """The trial run ``rid`` and the training runs under it that are still RUNNING end FAILED with ``reason``."""
        children = self.client.search_runs([self.experiment_id], f"tags.`mlflow.parentRunId` = '{rid}'")
        for run in [self.client.get_run(rid), *children]:
            if run.info.status == "RUNNING":
                for key in (TRIAL_STATE, FAIL_REASON, FAILURE):
                    retry_locked(self.client.set_tag, run.info.run_id, key, "FAIL" if key == TRIAL_STATE else reason)
                retry_locked(self.client.set_terminated, run.info.run_id, "FAILED")
        self.open_trials.discard(rid)

    def left_running(self) -> dict[int, str]:
        """{trial number: run id} of this study's trial runs still RUNNING in the store (one query)."""
        found = self.client.search_runs([self.experiment_id], f"tags.`mlflow.parentRunId` = '{self.parent_id}' and "
                                        "attributes.status = 'RUNNING'", max_results=5000)
        return {int(r.data.tags[TRIAL]): r.info.run_id for r in found
                if r.data.tags.get(KIND) == "tune-trial" and r.data.tags.get(TRIAL, "").isdigit()}

    def end_left(self, rid: str, state: TrialState, reason: str) -> None:
        """The trial run ``rid``, whose trial the storage holds ended as ``state``, and the training runs left RUNNING
        under it end as that state does (held-out round 13, H07: their process could not send the end)."""
        if state == TrialState.FAIL:
            self._fail_tree(rid, reason)
            return
        self._fail_tree_children(rid, reason)
        retry_locked(self.client.set_tag, rid, TRIAL_STATE, state.name)
        retry_locked(self.client.set_terminated, rid, "FINISHED" if state == TrialState.COMPLETE else "KILLED")

    def _fail_tree_children(self, rid: str, reason: str) -> None:
        for run in self.client.search_runs([self.experiment_id], f"tags.`mlflow.parentRunId` = '{rid}'"):
            if run.info.status == "RUNNING":
                retry_locked(self.client.set_tag, run.info.run_id, FAILURE, reason)
                retry_locked(self.client.set_terminated, run.info.run_id, "FAILED")

    def fail_open(self, reason: str) -> str:
        """The study cannot go on (its storage lost): the trial runs this process left open, the training runs under
        them and the study's run end FAILED with ``reason`` (``pobench.failure``). Returns what the command's line says
        of them; a store that fails too is said, not raised."""
        try:
            for rid in list(self.open_trials):
                self._fail_tree(rid, reason)
            if self.parent_id:
                retry_locked(self.client.set_tag, self.parent_id, FAILURE, reason[:5000])
                retry_locked(self.client.set_terminated, self.parent_id, "FAILED")
                return f"the study's MLflow run {self.parent_id} was ended FAILED"
            return "no MLflow run was open"
        except Exception as e:  # the MLflow store failing too: the line says so
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            return f"the study's MLflow run {self.parent_id} could not be ended ({first[:200]})"

    def log_progress(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.value is not None:
            self.client.log_metric(self.parent_id, K.TUNE_VALUE, float(trial.value), step=trial.number)
        try:
            self.client.log_metric(self.parent_id, K.TUNE_BEST_VALUE, float(study.best_value), step=trial.number)
        except ValueError:  # no complete trial yet
            pass
        for name, state in (("complete", TrialState.COMPLETE), ("pruned", TrialState.PRUNED),
                            ("failed", TrialState.FAIL)):
            self.client.log_metric(self.parent_id, K.TUNE_COUNT.format(state=name), count(study, state),
                                   step=trial.number)

    def finish_parent(self, study: optuna.Study, spec: TuneSpec, complete: bool) -> None:
        """The study run's best-trial tags, then FINISHED when the study is complete. Every worker writes them as it
        ends: the best trial is read from the study's storage and its tags written in one batch while the store is
        held, so the tags always describe one trial, the newest best any worker saw (MLflow writes a batch's tag
        that another process inserted meanwhile again)."""
        with store_lock(self.uri):
            try:
                best = study.best_trial  # (read from the storage now: trials other workers finished count)
            except ValueError:
                best = None
            if best is not None:
                tags = {BEST_TRIAL: str(best.number), BEST_VALUE: f"{best.value:.6g}",
                        **{f"best.{k}": str(v) for k, v in best.params.items()}}
                log_batch(self.client, self.parent_id, tags=[_tag(k, v) for k, v in tags.items()])
        if complete:
            retry_locked(self.client.set_terminated, self.parent_id, "FINISHED")

    def log_summary(self, imp: Importance, confirm: dict[str, Any] | None) -> None:
        """The importances (``tune/importance/<param>``, step = the complete trials they rest on) and the confirm
        (``tune/confirm_*``, step = the seeds it rests on; tags: verdict, trial, seeds) on the study's run."""
        now = int(time.time() * 1000)
        metrics = [_metric(K.TUNE_IMPORTANCE.format(param=k), v, now, imp.n_complete)
                   for k, v in imp.normalized.items()]
        tags = {}
        if confirm:
            summary = summary_of(confirm)
            tags = {CONFIRM: "default" if summary is None else summary.verdict, CONFIRM_TRIAL: str(confirm["trial"]),
                    CONFIRM_SEEDS: ",".join(map(str, confirm["seeds"]))}
            if summary is not None and summary.seeds:
                stats = {"default": sum(summary.default.values()) / len(summary.seeds),
                         "best": sum(summary.best.values()) / len(summary.seeds), "diff": summary.diff,
                         "diff_low": summary.low, "diff_high": summary.high, "p": summary.p}
                metrics += [_metric(K.TUNE_CONFIRM.format(stat=k), float(v), now, len(summary.seeds))
                            for k, v in stats.items() if v is not None]
        latest = self.client.get_run(self.parent_id).data.metrics  # (a rerun logs no repeated point)
        metrics = [m for m in metrics if latest.get(m.key) != m.value]
        log_batch(self.client, self.parent_id, metrics=metrics, tags=[_tag(k, v) for k, v in tags.items()])

    def log_artifacts(self, folder: Path) -> None:
        self.client.log_artifacts(self.parent_id, str(folder), artifact_path="tune")


def _version_tags() -> dict[str, str]:
    return version_tags(commit=False)  # pobench.version (tune runs carry no commit tag)


def log_outputs(spec: TuneSpec, study: optuna.Study, out: Path) -> None:
    """Log the output folder of a study (``bench.tune.outputs``) to its MLflow parent run, when it has one, with the
    parameter importances and the confirm's result as metrics and tags."""
    runs = StudyRuns(tracking_uri(spec.base.tracking_uri), spec.base.experiment, spec.study)
    runs.parent_id = study.user_attrs.get("mlflow_parent_run_id", "")
    if runs.parent_id:
        runs.log_artifacts(out)
        runs.log_summary(importances(study), study.user_attrs.get(CONFIRM_ATTR))
