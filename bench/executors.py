"""Where the jobs of `bench run` (its step-0 evaluation, its (objective, seed) pairs: bench/comparison/pairs.py) and of
`bench tune` (its workers: bench/tune/workers.py) run: ``local`` (this machine: one after another in this process,
or a pool of processes) or ``ray`` (one Ray task each, on a local Ray instance or an existing cluster). The one
executor of N jobs: both commands start, wait for, stop and lose their workers the same way.

Every executor runs the same functions, so reuse, resume, ``--force`` and the MLflow records are the same whichever
trains the pairs, and a pair trained by one executor is reused by the other. They differ only in how a job is
started, waited for, and cancelled (a ``_Backend``); the wait / drain loop (``Executor.run``) is one: it collects each
job's result as it ends, passes the progress events the jobs sent (start / step / eval / msg) to ``notify``, and on
Ctrl-C (or SIGTERM) cancels the running jobs, lets them checkpoint, and raises KeyboardInterrupt.

Local pool: processes forked from a ``forkserver`` that imported what a pair needs once (torch, MLflow, and the
training loop with transformers, or the module of a job's own ``train_fn``: ``bench.workers.pool_preload``) and
holds no other state; a fresh one for each pool, stopped and reaped with it (so no process of a pool outlives it,
and the CPU its workers used is counted where the command's is). Spawned workers imported all of that each (about 5
CPU-seconds each). No fork of a process holding torch / MLflow state (the command's own: its threads, its store's
connections). One torch thread each, SIGINT ignored in the workers: Ctrl-C reaches the parent, which stops handing
out jobs and sends SIGTERM to the busy workers; the training loop turns that into its interrupt path (checkpoint the
last finished step, run KILLED), so rerunning the command resumes exactly there. Results are identical to running
the pairs one after another: every random draw of a run is a pure function of its config and seed, and every run
uses one intra-op thread either way.

Ray (optional: ``pip install 'pobench[ray]'``): each job gets one GPU when the cluster has GPUs (and the config does
not ask for ``device: cpu``), else one CPU. Jobs are not retried by Ray (``max_retries=0``): a pair whose job fails
is reported with the pair named and the error, the other pairs go on, and rerunning the command resumes or retrains it
like any failed pair. Ctrl-C cancels the jobs with a KeyboardInterrupt inside them, so each busy pair takes the
training loop's interrupt path exactly as under the local pool. Without ``--ray-address`` a local Ray instance is
started with ``--workers`` CPUs (0: every usable core) and stopped at the end; with an address (``auto``,
``HOST:PORT``, ``ray://HOST:10001``) the command connects to that cluster. Every node needs pobench and its
dependencies installed (the same version as the driver), and the output folder and a local MLflow store on storage
all nodes share (or an MLflow server / PostgreSQL store): docs/SCALE.md, "Spreading a comparison over a Ray cluster".
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import os
import pickle
import queue as queue_mod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from bench.config import TrainConfig
from bench.faults import exit_called
from bench.runs import stop
from bench.runs.stop import sigterm_as_interrupt
from bench.workers import (
    RAY_INSTALL,
    WORKER_PID,
    Notify,
    absolute_tracking_uri,
    busy,
    import_ray,
    init_ray,
    lost_worker,
    pool_context,
    pool_preload,
    pool_worker_setup,
    resolve_workers,
    stop_forkserver,
    stop_or_kill,
    stop_tasks,
    task_context,
    task_resources,
    task_setup,
    worker_lost,  # noqa: F401  (bench.tune.workers: from here)
)

# the executors `bench run --executor` accepts, with the one line `--help` and the errors show for each
EXECUTORS: dict[str, str] = {
    "local": "this machine: --workers processes (1 = in this process)",
    "ray": "one Ray task per (objective, seed) pair, one GPU each when the cluster has GPUs, else one CPU; a local "
           "Ray instance with --workers CPUs, or the cluster at --ray-address (needs `pip install 'pobench[ray]'`)",
}
DEFAULT_EXECUTOR = "local"


@dataclass
class Job:
    """One unit of work: ``fn(notify, *args)``, run where the executor runs it (``fn``, ``args`` and ``not_started``
    travel to the worker, pickled; the rest stays here)."""

    index: int                     # the pair's position (-1: the comparison's own, e.g. its step-0 evaluation)
    fn: Callable[..., Any]
    args: tuple = ()
    not_started: Any = None        # its result when Ctrl-C came before it started
    interrupted: Any = None        # its result when it was interrupted inside a worker
    failed: Callable[[str, str], Any] | None = None  # failed(why, detail): its result when its worker itself died
    label: str = ""                # how a line names it ("grpo seed 0"): the pair whose worker died, to the others


class Interrupted:
    """What a worker returns for a task it stopped on KeyboardInterrupt (Ctrl-C, SIGTERM, an on_eval hook)."""


@dataclass
class WorkerDied:
    """The result of a task whose worker itself died (``Job.failed`` None)."""

    why: str      # one line, e.g. "worker process ended (BrokenProcessPool: ...)"
    detail: str   # the error in full
    error: BaseException | None = None  # the exception itself (the job's own error, or the executor's: worker_lost)


def make_executor(name: str | None = None, *, workers: int | None = None, ray_address: str | None = None):
    """The executor called ``name`` (default ``local``); every argument is checked here, before anything runs."""
    name = DEFAULT_EXECUTOR if name is None else str(name).strip().lower()
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; choices: {', '.join(EXECUTORS)}")
    if workers is not None and int(workers) < 0:
        raise ValueError(f"--workers must be >= 0 (0 = one per CPU core), got {workers}")
    if ray_address is not None and name != "ray":
        raise ValueError(f"--ray-address {ray_address!r} needs --executor ray (the {name} executor does not use Ray)")
    if name == "ray":
        if importlib.util.find_spec("ray") is None:
            raise ValueError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL}")
        return RayExecutor(workers=workers, address=ray_address or None)
    return LocalExecutor(workers=workers)


# ------------------------------------------------------------------ the one wait / drain loop
class Executor:
    """The calls of a comparison: ``prepare`` (the config the tasks get), ``start`` (how many run at once), ``run``
    (tasks, as many times as needed) and ``close``. Subclasses provide the backend."""

    name = ""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers
        self.slots = 1
        self.backend: _Backend | None = None

    def prepare(self, cfg: TrainConfig) -> TrainConfig:
        return cfg

    def spawns(self, n_todo: int, cfg: TrainConfig) -> bool:
        """Whether ``n_todo`` pairs of ``cfg`` would run in other processes (which import the plugins, not
        ``__main__``)."""
        raise NotImplementedError

    def start(self, n_todo: int, cfg: TrainConfig, shipped: dict[str, Any] | None = None) -> int:
        """Get ready to run ``n_todo`` pairs of ``cfg``; ``shipped``: {name: callable} that travel to the workers
        (checked to be picklable where they must be). Returns the number of pairs that run at once."""
        raise NotImplementedError

    def run(self, tasks: list[Job], notify: Notify, on_result: Callable[[Job, Any], None] | None = None
            ) -> dict[int, Any]:
        """Run ``tasks``; returns {task index: result}. KeyboardInterrupt (Ctrl-C, SIGTERM here, or a task
        interrupted in its worker) is raised once the running tasks have stopped."""
        if not tasks:
            return {}
        backend = self.backend
        handles = {}
        results: dict[int, Any] = {}
        interrupted = False
        with sigterm_as_interrupt():  # `kill <parent>` stops the workers as cleanly as Ctrl-C
            try:
                for t in tasks:
                    handles[backend.submit(t, notify)] = t
                pending = list(handles)
                while pending:
                    done, pending = backend.wait(pending)
                    _forward(backend, notify)
                    for h in done:
                        t = handles[h]
                        r = backend.result(h, t)
                        if isinstance(r, Interrupted):
                            r, interrupted = t.interrupted, True
                        results[t.index] = r
                        if on_result is not None:
                            on_result(t, r)
                _forward(backend, notify)
            except KeyboardInterrupt:  # (a task that ended on its own meanwhile is collected: held-out round 13, H32)
                stop_tasks(backend, handles, results, on_result, lambda: _forward(backend, notify), Interrupted)
                raise
        if interrupted:
            raise KeyboardInterrupt  # an on_eval hook (or a signal to a worker) interrupted a task
        return results

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None


def _forward(backend: _Backend, notify: Notify) -> None:
    for event in backend.events():
        notify(*event)


class _Backend:
    """How tasks are started (``submit``), waited for, read (``result``), cancelled; ``events`` are the progress
    events the tasks sent since the last call."""

    def submit(self, task: Job, notify: Notify) -> Any: ...
    def wait(self, pending: list) -> tuple[list, list]: ...
    def result(self, handle: Any, task: Job) -> Any: ...
    def events(self) -> list[tuple]: ...
    def cancel(self, handles: list) -> None: ...
    def close(self) -> None: ...


def _died(task: Job, what: str, e: BaseException, lost: str = "") -> Any:
    """The result of ``task`` whose worker died with ``e``; ``lost``: the line naming a lost worker (said alone)."""
    text = str(e).strip().splitlines()
    why = f"{what} ended ({type(e).__name__}: {text[0] if text else ''})".replace(": )", ")")
    if isinstance(e, WorkerSetupFailed):  # (the worker lives on: its plugin's line says it all)
        why = text[0] if text else why
    why, detail = (lost, "") if lost else (why, str(e))
    return WorkerDied(why, detail, e) if task.failed is None else task.failed(why, detail)


# ------------------------------------------------------------------ local: this process, or a process pool
class LocalExecutor(Executor):
    """The pairs on this machine: one after another in this process, or on a spawn process pool."""

    name = "local"

    def spawns(self, n_todo: int, cfg: TrainConfig) -> bool:
        return resolve_workers(self.workers, n_todo, cfg) > 1

    def start(self, n_todo: int, cfg: TrainConfig, shipped: dict[str, Any] | None = None) -> int:
        self.slots = resolve_workers(self.workers, n_todo, cfg)
        if self.slots > 1:
            for name, fn in (shipped or {}).items():
                try:
                    pickle.dumps(fn)
                except Exception as e:  # noqa: BLE001
                    raise ValueError(f"{name} runs in the worker processes and must be picklable (a module-level "
                                     f"function) ({e}); or pass workers=1") from None
            self.backend = _Pool(self.slots, cfg.plugins, pool_preload((shipped or {}).get("train_fn")))
        else:
            self.backend = _Inline()
        return self.slots


class _Later:
    """A task of ``_Inline``: run when the loop first waits for it."""

    def __init__(self, task: Job, notify: Notify) -> None:
        self.task, self.notify, self.value = task, notify, None


class _Inline(_Backend):
    """Tasks one after another in this process, each when the loop waits for it; its events go straight to
    ``notify``, and a Ctrl-C inside it reaches the loop as it happens."""

    def submit(self, task: Job, notify: Notify) -> Any:
        return _Later(task, notify)

    def wait(self, pending: list) -> tuple[list, list]:
        later = pending[0]
        later.value = later.task.fn(later.notify, *later.task.args)
        return [later], pending[1:]

    def result(self, handle: Any, task: Job) -> Any:
        return handle.value

    def events(self) -> list[tuple]:
        return []

    def cancel(self, handles: list) -> None:
        pass

    def close(self) -> None:
        pass


_WORKER: dict[str, Any] = {"queue": None, "stop": None, "setup": None}


class WorkerSetupFailed(RuntimeError):
    """A task's worker process could not load the run's plugins: the plugin's one line (``pool_worker_setup``)."""


def _pool_init(queue, stop, plugins: list[str], expected: str | None = None) -> None:
    # (the run's objectives and tasks, as in the parent; signals as the parent decides)
    from bench.plugins import plugins_changed

    _WORKER["setup"] = pool_worker_setup(plugins) or plugins_changed(plugins, expected)
    _WORKER["queue"], _WORKER["stop"] = queue, stop


def _pool_notify(*event: Any) -> None:
    _WORKER["queue"].put(event)


def _pool_task(fn: Callable[..., Any], args: tuple, not_started: Any, index: int | None = None) -> Any:
    if _WORKER["stop"].is_set():
        return not_started
    if _WORKER["setup"] is not None:
        raise WorkerSetupFailed(_WORKER["setup"])
    _WORKER["queue"].put((WORKER_PID, index, os.getpid()))  # (which process runs it: named if that one dies)
    try:
        with busy():
            return fn(_pool_notify, *args)
    except KeyboardInterrupt:
        return Interrupted()
    except SystemExit as e:  # a plugin's sys.exit outside a run's training: the pair's failure, in one line
        raise exit_called(e) from None


class _Pool(_Backend):
    def __init__(self, workers: int, plugins: list[str], preload: list[str]) -> None:
        self.ctx = ctx = pool_context(preload)
        stop.start_resource_tracker()  # (before its semaphores: one a closed terminal's SIGHUP leaves alive)
        self.queue, self.stop = ctx.Queue(), ctx.Event()
        # (a worker has the environment its server started with: this process's now, the server being the pool's own)
        from bench.plugins import plugins_tag

        self.pool = cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_pool_init,
                                           initargs=(self.queue, self.stop, list(plugins), plugins_tag(plugins)))
        # task index -> its worker's pid, -> its label; every worker process seen (pid -> process: the broken pool's
        # too); events read while a lost worker was looked for, not forwarded yet
        self.pids, self.labels, self.procs, self.held = {}, {}, {}, []

    def submit(self, task: Job, notify: Notify) -> Any:
        try:
            # (a submit may start the pool's workers: a stop signal there, after the forkserver made a worker and
            # before the pool recorded it, left a worker nobody ends and the pool's end waiting for it: held-out
            # round 12, H04. The signal comes once the submit is done.)
            self.labels[task.index] = task.label
            with stop.uninterrupted():
                return self.pool.submit(_pool_task, task.fn, task.args, task.not_started, task.index)
        except cf.BrokenExecutor as e:  # a worker died before this task started: reported as its failure
            failed: cf.Future = cf.Future()
            failed.set_exception(e)
            return failed

    def wait(self, pending: list) -> tuple[list, list]:
        self.procs.update(getattr(self.pool, "_processes", None) or {})
        done, rest = cf.wait(pending, timeout=0.2)
        return list(done), list(rest)

    def result(self, handle: Any, task: Job) -> Any:
        try:
            return handle.result()
        except cf.BrokenExecutor as e:  # a worker process died (SIGKILL: the out-of-memory killer): which, how
            self.held += self.events()
            return _died(task, "worker process", e, lost_worker(self.pool, self.procs, self.pids, self.labels,
                                                                task.index))
        except Exception as e:  # noqa: BLE001  (the worker process died otherwise)
            return _died(task, "worker process", e)

    def events(self) -> list[tuple]:
        out, self.held = self.held, []
        while True:
            try:
                event = self.queue.get_nowait()
            except queue_mod.Empty:
                return out
            if event[0] == WORKER_PID:
                self.pids[event[1]] = event[2]
            else:
                out.append(event)

    def cancel(self, handles: list) -> None:
        self.stop.set()  # queued tasks return "not started"
        stop_or_kill(self, handles)  # (SIGTERM; a busy worker still running after the grace: SIGKILL, named)
        stop_forkserver(self.ctx)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        stop_forkserver(self.ctx)


# ------------------------------------------------------------------ ray: one task each
class _EventLog:
    """A Ray actor collecting the tasks' progress events for the driver's display."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def put(self, event: tuple) -> None:
        self.events.append(event)

    def take(self) -> list[tuple]:
        out, self.events = self.events, []
        return out


def _remote_notify(events) -> Notify:
    ray = import_ray()

    def notify(*event: Any) -> None:
        try:
            ray.get(events.put.remote(event))  # waited for: the task's events arrive before its result
        except Exception:  # noqa: BLE001  (progress display only: never fails a pair)
            pass

    return notify


def _ray_task(fn: Callable[..., Any], args: tuple, index: int, events, ctx: dict[str, Any]) -> Any:
    notify = _remote_notify(events)
    try:
        task_setup(ctx, notify, index)
        return fn(notify, *args)
    except KeyboardInterrupt:  # ray.cancel (Ctrl-C in the driver) or an on_eval hook that interrupts
        return Interrupted()
    except SystemExit as e:  # a plugin's sys.exit: the pair's failure, in one line
        raise exit_called(e) from None


class RayExecutor(Executor):
    """Each task is one Ray task (see the module docstring)."""

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        super().__init__(workers)
        self.address = address

    def spawns(self, n_todo: int, cfg: TrainConfig) -> bool:
        return n_todo > 0

    def prepare(self, cfg: TrainConfig) -> TrainConfig:
        """Absolute paths for the store and the output folder: a Ray worker may run in another working folder."""
        return replace(cfg, tracking_uri=absolute_tracking_uri(cfg.tracking_uri),
                       output_dir=os.path.abspath(cfg.output_dir))

    def start(self, n_todo: int, cfg: TrainConfig, shipped: dict[str, Any] | None = None) -> int:
        if n_todo == 0:  # every pair reused: no Ray needed
            return 1
        ray = import_ray()
        owned = False
        if not ray.is_initialized():  # a program already connected to Ray (a notebook, a test) keeps its connection
            gpus = None
            if not self.address and cfg.device != "cpu":
                import torch

                gpus = torch.cuda.device_count() if torch.cuda.is_available() else None
            init_ray(self.address, self.workers, gpus)
            owned = True
        cluster = ray.cluster_resources()
        options = task_resources(cluster, cfg.device)
        kind = "GPU" if "num_gpus" in options else "CPU"
        self.slots = max(1, min(n_todo, int(cluster.get(kind, 1))))
        self.backend = _Ray(ray, options, task_context(cfg.tracking_uri, options, cfg.plugins), owned)
        return self.slots


class _Ray(_Backend):
    def __init__(self, ray, options: dict[str, Any], ctx: dict[str, Any], owned: bool) -> None:
        self.ray, self.ctx, self.owned = ray, ctx, owned
        self.log = ray.remote(num_cpus=0)(_EventLog).remote()
        self.task = ray.remote(_ray_task).options(**options, max_retries=0)

    def submit(self, task: Job, notify: Notify) -> Any:
        return self.task.remote(task.fn, task.args, task.index, self.log, self.ctx)

    def wait(self, pending: list) -> tuple[list, list]:
        return self.ray.wait(pending, num_returns=1, timeout=0.2)

    def result(self, handle: Any, task: Job) -> Any:
        try:
            return self.ray.get(handle)
        except Exception as e:  # noqa: BLE001  (the task itself failed: worker died, out of memory, import error)
            return _died(task, "Ray task", e)

    def events(self) -> list[tuple]:
        try:
            return self.ray.get(self.log.take.remote())
        except Exception:  # noqa: BLE001  (display only)
            return []

    def cancel(self, handles: list) -> None:
        """A KeyboardInterrupt in every running task (each checkpoints and ends its run KILLED); queued tasks never
        start. Waits for them (a second Ctrl-C stops waiting)."""
        for ref in handles:
            try:
                self.ray.cancel(ref, force=False)
            except Exception:  # noqa: BLE001  (already finished)
                pass
        try:
            self.ray.wait(handles, num_returns=len(handles), timeout=300)
        except Exception:  # noqa: BLE001
            pass

    def close(self) -> None:
        try:
            self.ray.kill(self.log)
        except Exception:  # noqa: BLE001
            pass
        if self.owned:
            self.ray.shutdown()
