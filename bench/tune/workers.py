"""Several workers of one study: `bench tune --workers N [--executor local|ray]`.

A worker is :func:`bench.tune.study.run_study`: it joins the study and runs trials until the study holds enough
finished ones, so N workers split the trials between them through the Optuna storage (each trial is claimed there
once; a dead worker's trial is re-queued by the others' heartbeat check). This module only starts them:

- ``local`` (default): 1 worker runs in this process; N > 1 run on a spawn process pool, one torch thread each
  (``--workers 0``: one per usable CPU core), never more than the trials still needed;
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
import multiprocessing
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import optuna

from bench.engines import RunStopped
from bench.inputs import SEED_MAX
from bench.plugins import check_shippable, with_plugins
from bench.runs.stop import sigterm_as_interrupt
from bench.runs.tracking import store_client
from bench.tune.spec import TuneSpec
from bench.tune.storage import FINISHED, count, default_storage_url, redact
from bench.tune.study import fail_dead_trials, open_study, run_study
from bench.workers import (
    absolute_tracking_uri,
    busy,
    import_ray,
    init_ray,
    pool_worker_setup,
    resolve_workers,
    stop_pool_workers,
    task_context,
    task_resources,
    task_setup,
)
from reports.record import retry_locked, tracking_uri

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

    def __init__(self, study: str, finished: int, trials: int, storage: str) -> None:
        super().__init__(f"study {study!r}: {finished}/{trials} trials finished, in {storage}")
        self.study, self.finished, self.trials, self.storage = study, finished, trials, storage


def _worker(spec: TuneSpec, i: int, ctx: dict[str, Any] | None = None) -> int:
    """One worker, in a pool process or a Ray task; returns the number of trials the study holds finished."""
    if ctx is not None:  # a Ray task: the driver's environment and working folder, as a pair's task gets them
        task_setup(ctx, lambda *event: print(f"[worker {i}] {event[-1]}", flush=True), i)
    else:  # a pool process: as a pair's (bench/compare/executors.py); SIGTERM ends its trial FAIL, queued again
        pool_worker_setup(spec.base.plugins)
    with busy():
        study = run_study(spec, log=lambda m: print(f"[worker {i}] {m}", flush=True), worker=str(i))
    return count(study, *FINISHED)


def run_workers(spec: TuneSpec, workers: int = 1, executor: str = "local", ray_address: str | None = None,
                log=print):
    """Run the study with ``workers`` workers on ``executor``; returns the study (as ``run_study`` does)."""
    n = resolve_workers(workers, spec.trials, spec.base)  # (a bad value: an error before anything is created)
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; choices: {', '.join(EXECUTORS)}")
    if ray_address is not None and executor != "ray":
        raise ValueError(f"--ray-address {ray_address!r} needs --executor ray")
    spec = dataclasses.replace(spec, base=with_plugins(spec.base, [spec.algo]))
    try:
        with sigterm_as_interrupt():  # `kill <this process>` stops the study as cleanly as Ctrl-C
            return _run_workers(spec, workers, n, executor, ray_address, log)
    except KeyboardInterrupt:
        raise _stopped(spec) from None


def _stopped(spec: TuneSpec) -> StudyStopped:
    """What a stopped study kept; its MLflow parent run ends KILLED (a rerun sets it RUNNING again)."""
    url = spec.storage or default_storage_url()
    finished = 0
    with contextlib.suppress(KeyError):  # (stopped before the study was created)
        study = optuna.load_study(study_name=spec.study, storage=url)
        finished = count(study, *FINISHED)
        parent = study.user_attrs.get("mlflow_parent_run_id")
        if parent:
            client = store_client(tracking_uri(spec.base.tracking_uri))
            if client.get_run(parent).info.status == "RUNNING":  # (the workers end their trials' runs now too)
                retry_locked(client.set_terminated, parent, "KILLED")
    return StudyStopped(spec.study, finished, spec.trials, redact(url))


def _worker_died(study: optuna.Study, spec: TuneSpec, runs) -> RunStopped:
    """After a pool process died: its trial failed and queued again (its lock is free), its MLflow run ended, the
    study's parent run ended FAILED; the one line of what was kept and how to go on."""
    fail_dead_trials(study, spec, runs)
    client = store_client(tracking_uri(spec.base.tracking_uri))
    if client.get_run(runs.parent_id).info.status == "RUNNING":
        retry_locked(client.set_terminated, runs.parent_id, "FAILED")
    url = spec.storage or default_storage_url()
    done = count(optuna.load_study(study_name=spec.study, storage=url), *FINISHED)
    return RunStopped(f"a worker process of study {spec.study!r} died (killed by a signal: the out-of-memory killer, "
                      f"kill -9); {done} of {spec.trials} trials finished in {redact(url)}, its trial and the others "
                      "stopped with it are queued again: rerun the same command to finish the study")


def _run_workers(spec: TuneSpec, workers: int, n: int, executor: str, ray_address: str | None, log) -> optuna.Study:
    """``run_workers`` once its flags are checked: ``n`` workers at most (``resolve_workers``)."""
    if executor == "local" and workers == 1:
        return run_study(spec, log=log)
    check_shippable(spec.base, [spec.algo])  # a notebook's objective: one line before any worker starts
    if executor == "ray":
        import_ray()  # not installed: one line now
        storage = spec.storage or default_storage_url()
        if ray_address and storage.startswith("sqlite"):
            raise ValueError(f"--storage {storage}: a SQLite file is not shared by the nodes of a Ray cluster; give "
                             "a PostgreSQL URL every node reaches (docs/TUNING.md)")
        spec = dataclasses.replace(spec, storage=storage, base=dataclasses.replace(
            spec.base, tracking_uri=absolute_tracking_uri(spec.base.tracking_uri),
            output_dir=os.path.abspath(spec.base.output_dir)))
    study, runs = open_study(spec)  # created (with its MLflow parent run) once, before the workers join it
    fail_dead_trials(study, spec, runs)  # trials of a process killed just now: queued again for these workers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    missing = max(1, spec.trials - count(study, *FINISHED))
    if executor == "ray":
        _run_ray(spec, workers, missing, ray_address, runs.parent_id, log)
    else:
        n = min(n, missing)
        if n == 1:
            return run_study(spec, log=log)
        log(f"study {spec.study!r}: {n} local workers (parent MLflow run {runs.parent_id})")
        try:
            with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = [pool.submit(_worker, worker_spec(spec, i), i) for i in range(n)]
                try:
                    for f in futures:
                        f.result()  # a worker's error: raised here, after the others have finished their trials
                except KeyboardInterrupt:  # SIGTERM to every worker (a scheduler may have sent it too: once is taken)
                    stop_pool_workers(pool)
                    raise  # (leaving the pool waits for the workers, each having queued its trial again)
        except BrokenProcessPool:  # a worker killed (the OOM killer, kill -9): the pool stops the others (SIGTERM)
            raise _worker_died(study, spec, runs) from None
    return optuna.load_study(study_name=spec.study, storage=spec.storage or default_storage_url())


def _run_ray(spec: TuneSpec, workers: int, missing: int, address: str | None, parent_id: str, log) -> None:
    """``workers`` Ray tasks (0: one per CPU, or per GPU when the cluster has GPUs, of the cluster), at most
    ``missing``."""
    ray = import_ray()
    owned = False
    if not ray.is_initialized():  # a program already connected to Ray (a notebook, a test) keeps its connection
        init_ray(address, workers or None, None)
        owned = not address
    try:
        cluster = ray.cluster_resources()
        options = task_resources(cluster, spec.base.device)
        slots = int(cluster.get("GPU" if "num_gpus" in options else "CPU", 1))
        n = max(1, min(workers or slots, missing))
        log(f"study {spec.study!r}: {n} ray workers (parent MLflow run {parent_id})")
        ctx = task_context(spec.base.tracking_uri, options, spec.base.plugins)
        task = ray.remote(_worker).options(**options, max_retries=0)
        refs = [task.remote(worker_spec(spec, i), i, ctx) for i in range(n)]
        try:
            ray.get(refs)
        except KeyboardInterrupt:  # Ctrl-C: each worker's running trial ends FAIL and is queued again
            for r in refs:
                ray.cancel(r)
            raise
    finally:
        if owned:
            ray.shutdown()
