"""Where the (objective, seed) pairs of `bench run` are trained: ``local`` (this machine: in this process or a pool
of processes, bench/parallel.py) or ``ray`` (one Ray task per pair, on a local Ray instance or an existing cluster).

Both run the same function for a pair, :func:`bench.compare.pairs.run_pair`: it claims the pair with its lock file, asks the
MLflow store under the claim whether the pair already FINISHED (reuse) or has a checkpoint (resume), else trains it.
So reuse, resume, ``--force`` and the MLflow records are the same whichever executor trains the pairs, and a pair
trained by one executor is reused by the other. The harness (bench/harness.py) talks to an executor through four
calls: :meth:`prepare` (the config the pairs get), :meth:`start` (how many pairs run at once), :meth:`execute` (the
pairs, after the comparison's shared step-0 evaluation) and :meth:`close`.

Ray (optional: ``pip install 'pobench[ray]'``): each pair is one task with one GPU when the cluster has GPUs (and the
config does not ask for ``device: cpu``), else one CPU; the shared step-0 evaluation is one task with the same
resources. Tasks are not retried by Ray (``max_retries=0``): a pair whose task fails is reported with the pair named
and the error, the other pairs go on, and rerunning the command resumes or retrains it like any failed pair. Ctrl-C
(or SIGTERM) cancels the tasks with a KeyboardInterrupt inside them, so each busy pair takes the training loop's
interrupt path (checkpoint, run KILLED) exactly as under the local pool. Without ``--ray-address`` a local Ray
instance is started with ``--workers`` CPUs (0: every usable core) and stopped at the end; with an address
(``auto``, ``HOST:PORT``, ``ray://HOST:10001``) the command connects to that cluster. Every node needs pobench and its
dependencies installed (the same version as the driver), and the output folder and a local MLflow store on storage
all nodes share (or an MLflow server / PostgreSQL store): docs/SCALE.md, "Spreading a comparison over a Ray cluster".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.compare.pairs import Notify, PairJob, PairResult
from bench.config import TrainConfig

# the executors `bench run --executor` accepts, with the one line `--help` and the errors show for each
EXECUTORS: dict[str, str] = {
    "local": "this machine: --workers processes (1 = in this process)",
    "ray": "one Ray task per (objective, seed) pair, one GPU each when the cluster has GPUs, else one CPU; a local "
           "Ray instance with --workers CPUs, or the cluster at --ray-address (needs `pip install 'pobench[ray]'`)",
}
DEFAULT_EXECUTOR = "local"
RAY_INSTALL = "pip install 'pobench[ray]'"
# environment variables a Ray task gets from the driver (a remote node does not have the driver's environment)
FORWARDED_ENV_PREFIXES = ("MLFLOW_", "POBENCH_")
FORWARDED_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM")


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
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ValueError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL}")
        return RayExecutor(workers=workers, address=ray_address or None)
    return LocalExecutor(workers=workers)


# ------------------------------------------------------------------ local: this machine
class LocalExecutor:
    """The pairs on this machine: one after another in this process, or on a spawn process pool (bench/parallel.py)."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers
        self.slots = 1

    def prepare(self, cfg: TrainConfig) -> TrainConfig:
        return cfg

    def start(self, n_todo: int, cfg: TrainConfig, on_eval=None) -> int:
        from bench.compare.plan import resolve_workers

        self.slots = resolve_workers(self.workers, n_todo, cfg)
        if self.slots > 1 and on_eval is not None:
            import pickle

            try:
                pickle.dumps(on_eval)
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"on_eval runs in the worker processes and must be picklable (a module-level "
                                 f"function) ({e}); or pass workers=1") from None
        return self.slots

    def execute(self, jobs: list[PairJob], *, notify: Notify, on_eval=None, step0_cfg: TrainConfig | None = None,
                step0_seeds: list[int] = (), on_result: Callable[[PairResult], None] | None = None
                ) -> list[PairResult]:
        from bench.compare.pairs import execute

        return execute(jobs, workers=self.slots, notify=notify, on_eval=on_eval, step0_cfg=step0_cfg,
                       step0_seeds=step0_seeds, on_result=on_result)

    def close(self) -> None:
        pass


# ------------------------------------------------------------------ ray: one task per pair
def import_ray():
    """``ray``, or a ValueError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ValueError(f"--executor ray needs Ray ({e}): {RAY_INSTALL}") from None
    return ray


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def init_ray(address: str | None = None, workers: int | None = None, gpus: int | None = None):
    """Connect to the Ray cluster at ``address``, or start a local instance with ``workers`` CPUs (0 / None: every
    usable core) and ``gpus`` GPUs (None: Ray's own detection). Returns the ``ray`` module."""
    import logging

    ray = import_ray()
    if address and address.startswith("ray://"):  # Ray Client: the server side decides everything else
        ray.init(address=address)
    elif address:
        ray.init(address=address, log_to_driver=True, logging_level=logging.WARNING)
    else:
        kw: dict[str, Any] = {} if gpus is None else {"num_gpus": gpus}
        # "local": a new instance even when RAY_ADDRESS is set or a cluster runs on this machine (--ray-address auto
        # connects to that one); the workers' output (warnings, tracebacks) is shown here, as the pool's is
        ray.init(address="local", num_cpus=int(workers) if workers else usable_cores(), include_dashboard=False,
                 log_to_driver=True, logging_level=logging.WARNING, **kw)
    return ray


def task_resources(cluster: dict[str, float], device: str = "auto") -> dict[str, float]:
    """Ray resources of one pair: one GPU when the cluster has any (and the run is not pinned to the CPU), else one
    CPU."""
    if device != "cpu" and cluster.get("GPU", 0) >= 1:
        return {"num_gpus": 1}
    return {"num_cpus": 1}


def absolute_tracking_uri(uri: str, cwd: str | Path | None = None) -> str:
    """A local store's URI with an absolute path (a relative ``sqlite:///mlflow.db`` names a different file on a
    Ray worker whose working folder differs); other URIs unchanged."""
    base = Path(cwd or os.getcwd())
    if uri.startswith("sqlite:"):
        from sqlalchemy.engine import make_url

        url = make_url(uri)
        db = url.database
        if not db or db == ":memory:" or os.path.isabs(db):
            return uri
        return url.set(database=str(base / db)).render_as_string(hide_password=False)
    if uri.startswith("file:"):
        from urllib.parse import urlparse

        path = urlparse(uri).path
        return uri if os.path.isabs(path) else (base / path).as_uri()
    if "://" not in uri:  # a bare folder: MLflow's file store
        return uri if os.path.isabs(uri) else str(base / uri)
    return uri


def forwarded_env(uri: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES) or k in FORWARDED_ENV}
    env["MLFLOW_TRACKING_URI"] = uri
    return env


class _EventLog:
    """A Ray actor collecting the pairs' progress events (start / step / eval / msg) for the driver's display."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def put(self, event: tuple) -> None:
        self.events.append(event)

    def take(self) -> list[tuple]:
        out, self.events = self.events, []
        return out


def _code_root() -> str:
    import bench

    return str(Path(bench.__file__).resolve().parent.parent)


def _task_setup(ctx: dict[str, Any], notify: Notify, index: int) -> None:
    """In the Ray worker, before a pair or the step-0 evaluation: the driver's environment and working folder (when
    this node has it), one torch thread on a CPU task as in the local pool, and a note when this worker's pobench is
    not the driver's."""
    from bench.cli import quiet_libraries

    os.environ.update(ctx["env"])
    quiet_libraries()  # as in `bench`: no per-file progress bars of transformers in the forwarded output
    if os.path.isdir(ctx["cwd"]):
        os.chdir(ctx["cwd"])
    if ctx["cpu"]:
        import torch

        torch.set_num_threads(1)
    here = _code_root()
    if here != ctx["code_root"] and os.path.isdir(ctx["code_root"]):
        notify("msg", index, f"note: a Ray worker runs pobench from {here}, this process from {ctx['code_root']}")


def _remote_notify(events) -> Notify:
    import ray

    def notify(*event: Any) -> None:
        try:
            ray.get(events.put.remote(event))  # waited for: the pair's events arrive before its result
        except Exception:  # noqa: BLE001  (progress display only: never fails a pair)
            pass

    return notify


def _ray_pair(job: PairJob, on_eval, step0, events, ctx: dict[str, Any]) -> PairResult:
    """The Ray task of one pair: the local pool's pair function, :func:`bench.compare.pairs.run_pair`."""
    from bench.compare.pairs import run_pair

    notify = _remote_notify(events)
    try:
        _task_setup(ctx, notify, job.index)
        return run_pair(job, notify, on_eval, step0)
    except KeyboardInterrupt:  # ray.cancel (Ctrl-C in the driver) or an on_eval that interrupts
        return PairResult(job.index, "interrupted")


def _ray_step0(cfg: TrainConfig, seeds: list[int], events, ctx: dict[str, Any]) -> dict[int, dict[str, float]]:
    from bench.compare.pairs import initial_evals

    try:
        _task_setup(ctx, _remote_notify(events), -1)
        return initial_evals(cfg, seeds)
    except KeyboardInterrupt:
        return {}


class RayExecutor:
    """Each pair is one Ray task (see the module docstring)."""

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        self.workers, self.address = workers, address
        self.ray = None
        self.owned = False        # this executor started the Ray instance (and stops it in close)
        self.options: dict[str, Any] = {"num_cpus": 1}
        self.slots = 1

    def prepare(self, cfg: TrainConfig) -> TrainConfig:
        """Absolute paths for the store and the output folder: a Ray worker may run in another working folder."""
        from dataclasses import replace

        return replace(cfg, tracking_uri=absolute_tracking_uri(cfg.tracking_uri),
                       output_dir=os.path.abspath(cfg.output_dir))

    def start(self, n_todo: int, cfg: TrainConfig, on_eval=None) -> int:
        if n_todo == 0:  # every pair reused: no Ray needed
            return 1
        ray = import_ray()
        if not ray.is_initialized():  # a program already connected to Ray (a notebook, a test) keeps its connection
            gpus = None
            if not self.address and cfg.device != "cpu":
                import torch

                gpus = torch.cuda.device_count() if torch.cuda.is_available() else None
            init_ray(self.address, self.workers, gpus)
            self.owned = True
        self.ray = ray
        cluster = ray.cluster_resources()
        self.options = task_resources(cluster, cfg.device)
        kind = "GPU" if "num_gpus" in self.options else "CPU"
        self.slots = max(1, min(n_todo, int(cluster.get(kind, 1))))
        return self.slots

    def execute(self, jobs: list[PairJob], *, notify: Notify, on_eval=None, step0_cfg: TrainConfig | None = None,
                step0_seeds: list[int] = (), on_result: Callable[[PairResult], None] | None = None
                ) -> list[PairResult]:
        from bench.engines.native.loop import _sigterm_as_interrupt

        if not jobs:
            return []
        ray = self.ray
        uri = jobs[0].cfg.tracking_uri
        ctx = {"env": forwarded_env(uri), "cwd": os.getcwd(), "code_root": _code_root(),
               "cpu": "num_gpus" not in self.options}
        opts = {**self.options, "max_retries": 0}
        events = ray.remote(num_cpus=0)(_EventLog).remote()
        pair_task = ray.remote(_ray_pair).options(**opts)
        step0_task = ray.remote(_ray_step0).options(**opts)
        results: dict[int, PairResult] = {}
        refs: dict[Any, PairJob | None] = {}

        def drain() -> None:
            try:
                batch = ray.get(events.take.remote())
            except Exception:  # noqa: BLE001  (display only)
                return
            for event in batch:
                notify(*event)

        def wait_all() -> None:
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=0.2)
                drain()
                for ref in done:
                    job = refs.pop(ref)
                    if job is None:
                        continue
                    r = self._result(ref, job)
                    results[job.index] = r
                    if on_result is not None:
                        on_result(r)
            drain()

        restore = _sigterm_as_interrupt()  # `kill <driver>` stops the tasks as cleanly as Ctrl-C
        try:
            step0: dict[int, dict[str, float]] = {}
            if step0_cfg is not None:
                ref0 = step0_task.remote(step0_cfg, list(step0_seeds), events, ctx)
                refs[ref0] = None
                wait_all()
                try:
                    step0 = ray.get(ref0)
                except Exception as e:  # noqa: BLE001  (each run then evaluates its own step 0)
                    notify("msg", -1, f"the shared step-0 evaluation failed ({_first_line(e)}); each run evaluates "
                                      "its own step 0")
            for job in jobs:
                refs[pair_task.remote(job, on_eval, step0.get(job.pair.seed), events, ctx)] = job
            wait_all()
        except KeyboardInterrupt:
            self._cancel(list(refs), drain)
            raise
        finally:
            restore()
            try:
                ray.kill(events)
            except Exception:  # noqa: BLE001
                pass
        if any(r.outcome == "interrupted" for r in results.values()):
            raise KeyboardInterrupt  # an on_eval callback interrupted a pair in its task
        return [results[j.index] for j in jobs if j.index in results]

    def _result(self, ref, job: PairJob) -> PairResult:
        try:
            return self.ray.get(ref)
        except Exception as e:  # noqa: BLE001  (the task itself failed: worker died, out of memory, import error, ...)
            return PairResult(job.index, f"failed: Ray task ended ({_first_line(e)})", "train",
                              error=f"{job.pair.variant} seed {job.pair.seed}: {e}")

    def _cancel(self, refs: list, drain: Callable[[], None]) -> None:
        """Ctrl-C: a KeyboardInterrupt in every running task (each checkpoints and ends its run KILLED); queued tasks
        never start. Waits for them (a second Ctrl-C stops waiting)."""
        ray = self.ray
        for ref in refs:
            try:
                ray.cancel(ref, force=False)
            except Exception:  # noqa: BLE001  (already finished)
                pass
        try:
            ray.wait(refs, num_returns=len(refs), timeout=300)
        except Exception:  # noqa: BLE001
            pass
        drain()

    def close(self) -> None:
        if self.owned and self.ray is not None:
            self.ray.shutdown()
            self.owned = False


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
