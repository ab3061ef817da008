"""MLflow bookkeeping of a training run: the run itself, its tags and params, and a metric buffer that is flushed
only once a checkpoint covers it, so a killed and resumed run has no missing and no duplicated metric step.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, RunStatus

import bench
from bench.inputs import check_tracking_scheme
from reports import record
from reports.record import GIT_COMMIT, GIT_DIRTY, SOURCE_GIT_COMMIT, VERSION, get_or_create_experiment, open_client

TIMEOUT_ENV = "POBENCH_MLFLOW_TIMEOUT"  # seconds the reachability check of an MLflow server waits
DEFAULT_TIMEOUT_S = 5.0


def check_reachable(uri: str | None) -> str:
    """Resolve the tracking URI and, for an MLflow server (http/https), check that it answers within
    ``$POBENCH_MLFLOW_TIMEOUT`` seconds (default 5): one ValueError line naming the URI otherwise, before any model
    is loaded. (MLflow's own client retries a refused connection for about four minutes before it gives up.) Local
    stores (sqlite, file) need no check. Returns the resolved URI."""
    resolved = check_tracking_scheme(record.tracking_uri(uri))  # foo://bar: one line, not MLflow's traceback
    if not resolved.startswith(("http://", "https://")):
        return resolved
    try:
        timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={os.environ[TIMEOUT_ENV]!r}: expected a number of seconds") from None
    try:
        with urllib.request.urlopen(resolved.rstrip("/") + "/health", timeout=timeout):
            pass
    except urllib.error.HTTPError:  # the server answered (maybe 401 / 404 behind a proxy): it is reachable
        pass
    except (OSError, ValueError) as e:  # URLError (refused, DNS), timeouts, malformed URLs
        why = getattr(e, "reason", None) or e
        raise ValueError(f"MLflow tracking server {resolved} cannot be reached within {timeout:g} s ({why}); start it, "
                         f"or fix --tracking-uri / MLFLOW_TRACKING_URI ({TIMEOUT_ENV} sets the wait)") from None
    return resolved


def version_tags(commit: bool = True) -> dict[str, str]:
    """``pobench.version`` of this package and, when ``commit``, ``pobench.git_commit`` of its checkout; from a git
    checkout also MLflow's ``mlflow.source.git.commit`` and ``pobench.git_dirty`` (1: uncommitted changes to tracked
    files, so the commit alone does not identify the code)."""
    tags = {VERSION: str(bench.__version__)}
    if commit:
        tags[GIT_COMMIT] = git_commit()
        if tags[GIT_COMMIT] != "unknown":
            tags[SOURCE_GIT_COMMIT] = tags[GIT_COMMIT]
            dirty = _git("status", "--porcelain", "--untracked-files=no")
            if dirty is not None:
                tags[GIT_DIRTY] = "1" if dirty else "0"
    return tags


def git_commit() -> str:
    """The commit of the checkout the package runs from, or 'unknown'."""
    return _git("rev-parse", "HEAD") or "unknown"


def _git(*args: str) -> str | None:
    """``git ARGS`` in the package's folder: its stripped output, None when git or the checkout is missing."""
    try:
        out = subprocess.run(["git", *args], cwd=Path(bench.__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> {'a.b': 'value'} strings for MLflow params (values truncated to MLflow's limit)."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:6000]
    return out


class RunLogger:
    """One MLflow run: create or reopen it, buffer metrics, flush them when a checkpoint covers their steps."""

    def __init__(self, uri: str | None, experiment: str) -> None:
        self.uri = record.tracking_uri(uri)
        self.client = open_client(self.uri)  # a fresh local store is created under a lock (reports/record.py)
        self.experiment_id = get_or_create_experiment(self.client, self.uri, experiment)
        self.run_id: str | None = None
        self.pending: list[tuple[str, float, int, int]] = []  # (key, value, timestamp ms, step)

    def start(self, run_name: str, tags: dict[str, str], params: dict[str, str]) -> str:
        run = record.retry_locked(self.client.create_run, self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        record.log_batch(self.client, self.run_id, params=[mlflow.entities.Param(k, v) for k, v in params.items()])
        return self.run_id

    def reopen(self, run_id: str, pending: list[tuple[str, float, int, int]]) -> None:
        """Continue an existing run; re-log buffered metrics of the checkpoint that never reached the store."""
        self.run_id = run_id
        record.retry_locked(self.client.update_run, run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        keys = {k for k, _, _, _ in pending}
        have = {(k, m.step) for k in keys for m in self.client.get_metric_history(run_id, k)}
        self.pending = [p for p in pending if (p[0], p[3]) not in have]
        self.flush()

    def log(self, metrics: dict[str, float], step: int) -> None:
        ts = int(time.time() * 1000)
        self.pending.extend((k, float(v), ts, step) for k, v in metrics.items())

    def flush(self) -> None:
        """Send the buffered metrics (call after a checkpoint that covers them has been written)."""
        if not self.pending or self.run_id is None:
            return
        record.log_batch(self.client, self.run_id, metrics=[Metric(k, v, ts, step) for k, v, ts, step in self.pending])
        self.pending = []

    def set_tags(self, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            record.retry_locked(self.client.set_tag, self.run_id, k, v)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def end(self, status: str = "FINISHED") -> None:
        if self.run_id is not None:
            record.retry_locked(self.client.set_terminated, self.run_id, status=status)
