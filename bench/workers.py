"""What `bench run` and `bench tune` share about the processes and Ray tasks that train for them: the ``--seeds`` and
``--workers`` rules, how a worker process or Ray task is set up, what a local pool's forkserver imports before it
forks the workers (``pool_preload``), and the connection to Ray.

Ray is optional (``pip install 'pobench[ray]'``) and imported only when asked for. A Ray task gets the driver's
environment (``MLFLOW_*``, ``POBENCH_*``, the Hugging Face offline switches) and working folder (``task_setup``),
since a remote node has neither; local stores get absolute paths (``absolute_tracking_uri``) for the same reason.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.abc
import importlib.util
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

import bench
from bench.config import TrainConfig
from bench.engines.entry import engine_for
from bench.inputs import check_seed
from bench.model import resolve_device
from bench.plugins import load_plugins
from bench.runs import stop

RAY_INSTALL = "pip install 'pobench[ray]'"
# environment variables a Ray task gets from the driver (a remote node does not have the driver's environment)
FORWARDED_ENV_PREFIXES = ("MLFLOW_", "POBENCH_")
FORWARDED_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM")

Notify = Callable[..., None]  # notify(kind, index, *payload): "start" | "step" | "eval" | "msg"


# ------------------------------------------------------------------ --seeds, --workers
def parse_seeds(seeds: str | Sequence[int] | None, default: Sequence[int], flag: str = "--seeds") -> list[int]:
    """The seeds of ``--seeds`` (``bench run`` and ``bench tune``; ``flag`` names another flag of seeds in the
    errors): comma-separated integers, in the order given; a repeated seed (held-out round 13, H12: it was dropped
    without a word) or an empty list is an error; None gives ``default``."""
    if seeds is None:
        return list(default)
    if isinstance(seeds, str):
        try:
            seeds = [int(s) for s in seeds.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"{flag} must be comma-separated integers, got {seeds!r}") from None
    out = [check_seed(int(s), flag) for s in seeds]
    twice = next((s for i, s in enumerate(out) if s in out[:i]), None)
    if twice is not None or not out:
        raise ValueError(f"{flag} {','.join(map(str, out))}: seed {twice} is named twice; name each seed once"
                         if out else f"{flag} is empty")
    return out


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def resolve_workers(workers: int | None, n_todo: int, cfg: TrainConfig, default: int = 0) -> int:
    """Processes to train ``n_todo`` runs of ``cfg`` with (``default`` when None): 0 = one per usable CPU core (one
    when the model runs on a GPU, or when the engine trains one run at a time), capped by ``n_todo``."""
    n = default if workers is None else int(workers)
    if n < 0:
        raise ValueError(f"--workers must be >= 0 (0 = one per CPU core), got {n}")
    if n == 0:
        one_at_a_time = not engine_for(cfg).capabilities.parallel_pairs or resolve_device(cfg.device).type != "cpu"
        n = 1 if one_at_a_time else usable_cores()
    return max(1, min(n, n_todo))


# ------------------------------------------------------------------ a worker process
class _StoreErrorsRaised(logging.Filter):
    """Drops MLflow's ERROR records of a database error it then raises (``SQLAlchemy database error. The following
    exception is caught``, with its traceback): the command reports the raised error in its one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


def quiet_libraries() -> None:
    """No per-file progress bars from transformers / hub downloads in our output (our own displays remain).
    Transformers is quietened once it is imported (``_quiet_transformers``): importing it here would cost every
    process seconds of CPU, also those that never load a model (`bench --help`, a report, a pool process of a
    command whose trainer needs none)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    db_log = logging.getLogger("mlflow.store.db.utils")  # MLflow logs each database error it raises with its
    if not any(isinstance(f, _StoreErrorsRaised) for f in db_log.filters):  # traceback: the error is raised to us
        db_log.addFilter(_StoreErrorsRaised())
    if _HF_LOGGING in sys.modules:
        _quiet_transformers(sys.modules[_HF_LOGGING])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(_HF_LOGGING, _quiet_transformers))


_HF_LOGGING = "transformers.utils.logging"


def _quiet_transformers(hf_logging: Any) -> None:
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once the module ``name`` has been executed by its own loader, the first time anything
    imports it (then steps out of ``sys.meta_path``)."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # (the finders after this one: it has left sys.meta_path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run, then = loader.exec_module, self.then

        def exec_module(module: Any) -> None:
            del loader.exec_module  # (this module's loader instance: its own method again)
            run(module)
            then(module)

        loader.exec_module = exec_module
        return spec


def one_thread() -> None:
    """A CPU worker trains with one torch thread (the tiny models gain nothing from more; more oversubscribe)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(1)


_POOL_WORKER = {"busy": False}  # in a pool process: inside a task (``busy``)


def pool_worker_setup(plugins: Sequence[str]) -> str | None:
    """A pool process of `bench run` / `bench tune`: one torch thread, quiet libraries, the run's plugins; Ctrl-C
    ignored (it reaches the parent, which decides), SIGTERM and SIGHUP (``bench.runs.stop.TERMINATING``) taken only
    while a task runs (``busy``): the training's interrupt path, once; an idle worker ignores them and ends with the
    pool. Returns the one line of a plugin that failed to load here (it loaded in the command's process: held-out round
    10, a plugin depending on the working folder, an environment variable or being the main process), which each of its
    tasks reports: raised here, it was Python's "Exception in initializer" traceback and a broken pool whose pairs never
    named the plugin."""
    one_thread()
    quiet_libraries()
    try:
        load_plugins(list(plugins))
        failed = None
    except Exception as e:  # noqa: BLE001  (ValueError, one line, naming the plugin: bench/plugins.py _failed)
        failed = str(e).replace(" failed to load: ", " failed to load in a worker process: ", 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in stop.TERMINATING:  # (a closed terminal's SIGHUP reaches the workers too: held-out round 14, H08)
        signal.signal(sig, _on_pool_sigterm)
    threading.Thread(target=_watch_parent, name="pobench-parent-watch", daemon=True).start()
    return failed


#: the longest a busy worker of a dead parent is given to checkpoint and end its run KILLED before it exits anyway
ORPHAN_GRACE_S = 300.0


def _watch_parent() -> None:
    """A pool process whose parent died (SIGKILL, OOM killer) would live on, orphaned, holding its pair's lock and
    its run RUNNING: once the parent is gone, a busy worker takes the interrupt path (checkpoint, run KILLED, as on
    SIGTERM) and the process exits; an idle one exits at once. The parent is the process that made the pool (its
    multiprocessing sentinel), not the forkserver the worker was forked from: a SIGTERM to the process group ends
    the server, and the command, still alive, decides what its workers do."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is not None:
        parent.join()
    else:  # (not started by multiprocessing)
        ppid = os.getppid()
        while os.getppid() == ppid:
            time.sleep(1.0)
    if _POOL_WORKER["busy"]:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while _POOL_WORKER["busy"] and time.monotonic() < deadline:
            time.sleep(0.2)
    os._exit(143)


def _on_pool_sigterm(signum: int, frame: Any) -> None:
    if _POOL_WORKER["busy"]:
        stop.interrupt(signum, frame)


@contextlib.contextmanager
def busy():
    """A pool process's task: SIGTERM interrupts it (``pool_worker_setup``)."""
    _POOL_WORKER["busy"] = True
    try:
        yield
    finally:
        _POOL_WORKER["busy"] = False


def stop_pool_workers(pool: Any) -> None:
    """SIGTERM to every live process of a ``ProcessPoolExecutor`` (busy ones checkpoint and end KILLED, idle ones
    ignore it); a scheduler may have signalled them already: a second SIGTERM is ignored (``bench.runs.stop``)."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        if proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)


def stop_tasks(backend: Any, handles: dict, results: dict, on_result: Any, forward: Callable[[], None],
               interrupted: type) -> None:
    """``bench.executors.Executor.run`` stopped (Ctrl-C, SIGTERM): the tasks not collected yet are cancelled
    (``backend.cancel``; ``backend.stopping``: handle -> task index), then those that ended with a result of their own
    meanwhile (a pair that trained to its end: not an ``interrupted`` one) are passed to ``on_result``, so the
    command's line counts them (held-out round 13, H32: `kept 0 of 2 pairs finished` while one was FINISHED)."""
    rest = [h for h in handles if handles[h].index not in results]
    backend.stopping = {h: handles[h].index for h in rest}
    backend.cancel(rest)
    forward()
    for h in rest:
        if isinstance(h, concurrent.futures.Future) and h.done() and not h.cancelled() and h.exception() is None:
            r = backend.result(h, handles[h])
            if not isinstance(r, interrupted) and on_result is not None:
                on_result(handles[h], r)


#: the event a pool task sends first: (WORKER_PID, task index, pid), so that a worker that dies is named
WORKER_PID = "worker-pid"
#: how the line of a task that lost its pool worker begins (`bench run`'s summary then says to rerun the command)
LOST_WORKER = "lost its worker"


def _how_ended(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        oom = ": out of memory? the kernel's OOM killer sends it" if -code == signal.SIGKILL else ""
        return f"was killed by {name} (signal {-code}{oom})"
    return f"ended abruptly (exit code {code})"


def worker_lost(e: BaseException | None) -> bool:
    """Whether ``e`` says the worker itself was lost (its process killed: the out-of-memory killer, kill -9; a Ray
    worker or node gone), not that the job raised an error of its own."""
    if isinstance(e, concurrent.futures.BrokenExecutor):
        return True
    try:
        from ray.exceptions import NodeDiedError, WorkerCrashedError
    except ImportError:
        return False
    return isinstance(e, (WorkerCrashedError, NodeDiedError))


def lost_worker(pool: Any, procs: dict[int, Any], pids: dict[int, int], labels: dict[int, str], index: int) -> str:
    """One line saying why task ``index`` lost its worker when the process pool ``pool`` broke (BrokenProcessPool):
    its own worker process killed (by which signal), or ended by the pool because another task's worker died
    (naming it). ``procs``: the pool's worker processes seen (pid -> process), ``pids``: task index -> its worker's
    pid, ``labels``: task index -> its name. Waits for the pool to end its processes first (it ends them all once
    one died): their exit codes then say which one died."""
    manager = getattr(pool, "_executor_manager_thread", None)
    if manager is not None:
        manager.join(timeout=60)
    codes = {pid: p.exitcode for pid, p in procs.items()}
    dead = [pid for pid, code in codes.items() if code not in (None, 0, 1, *(-s for s in stop.TERMINATING))]
    own = pids.get(index)
    if own is not None and own in dead:
        return f"{LOST_WORKER}: process {own} {_how_ended(codes[own])}"
    if len(dead) == 1:
        who = next((labels.get(i) or f"task {i}" for i, pid in pids.items() if pid == dead[0]), "an idle worker")
        return (f"{LOST_WORKER}: stopped when the process pool broke: the worker process {dead[0]} of {who} "
                f"{_how_ended(codes[dead[0]])}")
    return f"{LOST_WORKER}: the process pool broke (a worker process ended abruptly: killed? out of memory?)"


#: how long a stopping command waits for its pool's busy workers after SIGTERM (each checkpoints its last step and
#: ends its run KILLED) before it SIGKILLs one still running: one ignoring SIGTERM (held-out round 13, H32) or frozen
#: (SIGSTOP, a debugger, a hung NFS read: H33) would hold it for ever; ``$POBENCH_POOL_STOP_GRACE`` (seconds) sets it
POOL_STOP_GRACE_S = 30.0
STOP_GRACE_ENV = "POBENCH_POOL_STOP_GRACE"


def stop_grace_s() -> float:
    """``$POBENCH_POOL_STOP_GRACE`` (seconds, >= 0), else ``POOL_STOP_GRACE_S``; a ValueError naming the variable
    otherwise, asked before any work (held-out round 16, H28: a malformed value was ignored without a word)."""
    raw = os.environ.get(STOP_GRACE_ENV, "").strip()
    try:
        value = float(raw) if raw else POOL_STOP_GRACE_S
    except ValueError:
        raise ValueError(f"{STOP_GRACE_ENV}={raw!r}: give a number of seconds") from None
    if 0 <= value < float("inf"):
        return value
    raise ValueError(f"{STOP_GRACE_ENV}={raw!r}: give a number of seconds >= 0")


def runs_held(pid: int) -> list[Path]:
    """The run folders whose run lock (``<parent>/.locks/<run folder>.run.lock``) process ``pid`` holds open: what
    it trains (from Linux's ``/proc``; empty elsewhere)."""
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if target.name.endswith(".run.lock") and target.parent.name == ".locks":
            out.append(target.parent.parent / target.name.removesuffix(".run.lock"))
    return sorted(set(out))


def stop_or_kill(backend: Any, handles: list) -> None:
    """End the process pool of ``backend`` (``bench.executors._Pool``) on a stop: SIGTERM to its workers (busy ones
    checkpoint and end their run KILLED), queued tasks cancelled, then :func:`stop_grace_s` for the tasks ``handles``
    to end; a worker still running one of them then (``backend.pids`` of ``backend.stopping``: the marks its tasks
    sent) is SIGKILLed and named (:func:`kill_stuck_worker`)."""
    pool = backend.pool
    stop_pool_workers(pool)
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    grace = stop_grace_s()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not all(h.done() for h in handles):
        time.sleep(0.1)
    if not all(h.done() for h in handles):
        backend.held += backend.events()  # (the marks: which process runs which task)
        busy_now = {backend.pids[i] for h, i in getattr(backend, "stopping", {}).items()
                    if not h.done() and i in backend.pids}
        for proc in procs:
            if proc.is_alive() and proc.pid in busy_now:
                print(kill_stuck_worker(proc, grace), file=sys.stderr, flush=True)
    if manager is not None:
        manager.join(grace + 60)


def kill_stuck_worker(proc: Any, grace: float) -> str:
    """SIGKILL the pool process ``proc`` (a ``multiprocessing`` process) that did not stop within ``grace`` seconds
    of SIGTERM, and end the MLflow runs it trained KILLED (``bench.runs.lifecycle.end_killed_worker_run``: their
    last checkpoint kept, the rerun resumes them); returns the one line that says so."""
    from bench.runs.run import end_killed_worker_run

    runs = runs_held(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    ended = [run_id for r in runs if (run_id := end_killed_worker_run(r)) is not None]
    what = f" (training {', '.join(r.name for r in runs)})" if runs else ""
    return (f"bench: worker process {proc.pid}{what} did not stop within {grace:g} s of SIGTERM (code in it ignores "
            "SIGTERM, as a plugin's signal.signal(SIGTERM, SIG_IGN) does, or the process is frozen: SIGSTOP, a "
            f"debugger): killed it (SIGKILL)" + (f"; its MLflow run {', '.join(ended)} ended KILLED, its last "
                                                 "checkpoint kept" if ended else "")
            + f" ({STOP_GRACE_ENV} sets the wait)")


# ------------------------------------------------------------------ Ray
def import_ray():
    """``ray``, or a ValueError that says how to install it."""
    try:
        import ray  # (optional dependency)
    except ImportError as e:
        raise ValueError(f"--executor ray needs Ray ({e}): {RAY_INSTALL}") from None
    return ray


def init_ray(address: str | None = None, workers: int | None = None, gpus: int | None = None):
    """Connect to the Ray cluster at ``address``, or start a local instance with ``workers`` CPUs (0 / None: every
    usable core) and ``gpus`` GPUs (None: Ray's own detection). Returns the ``ray`` module."""
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
    """Ray resources of one run: one GPU when the cluster has any (and the run is not pinned to the CPU), else a CPU."""
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
        path = urlparse(uri).path
        return uri if os.path.isabs(path) else (base / path).as_uri()
    if "://" not in uri:  # a bare folder: MLflow's file store
        return uri if os.path.isabs(uri) else str(base / uri)
    return uri


def forwarded_env(uri: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES) or k in FORWARDED_ENV}
    env["MLFLOW_TRACKING_URI"] = uri
    return env


def code_root() -> str:
    """The folder pobench runs from (the parent of the ``bench`` package)."""
    return str(Path(bench.__file__).resolve().parent.parent)


def task_context(uri: str, resources: dict[str, float], plugins: Sequence[str] = ()) -> dict[str, Any]:
    """What a Ray task needs from the driver (``task_setup``): environment, working folder, code, CPU / GPU, plugins."""
    return {"env": forwarded_env(uri), "cwd": os.getcwd(), "code_root": code_root(), "cpu": "num_gpus" not in resources,
            "plugins": list(plugins)}


def task_setup(ctx: dict[str, Any], notify: Notify, index: int) -> None:
    """In the Ray worker, before its work: the driver's environment and working folder (when this node has it), one
    torch thread on a CPU task as in the local pool, and a note when this worker's pobench is not the driver's."""
    os.environ.update(ctx["env"])
    quiet_libraries()  # as in `bench`: no per-file progress bars of transformers in the forwarded output
    if os.path.isdir(ctx["cwd"]):
        os.chdir(ctx["cwd"])
    if ctx["cpu"]:
        torch.set_num_threads(1)
    here = code_root()
    if here != ctx["code_root"] and os.path.isdir(ctx["code_root"]):
        notify("msg", index, f"note: a Ray worker runs pobench from {here}, this process from {ctx['code_root']}")
    load_plugins(ctx.get("plugins", ()))  # after the working folder: the driver's objectives and tasks


# ------------------------------------------------------------------ the forkserver of a local pool (bench/executors.py)
#: imported once, by the forkserver a pool's workers are forked from: what every job imports (a pair or a tune
#: worker, MLflow's client and its SQLite store, which pobench imports on first use); a name missing here costs each
#: worker its import (MLflow's: ~2 CPU-seconds a worker)
POOL_PRELOAD = ["bench.comparison.pairs", "bench.tune.workers", "mlflow.tracking",
                "mlflow.store.tracking.sqlalchemy_store"]
#: and what pobench's own training imports: the native loop, transformers' model of the built-in policy (~3 CPU-seconds
#: more, torch's compiler modules among them, which transformers imports)
ENGINE_PRELOAD = ["bench.engines.native.loop", "transformers.models.llama.modeling_llama"]


def pool_preload(train_fn: Callable[..., Any] | None) -> list[str]:
    """What a pool's server imports for jobs that train with ``train_fn``: pobench's engines (``None``, or a function
    of ``bench.engines``: ``bench.engines.entry.train``) add ``ENGINE_PRELOAD``; a function of a notebook or a test
    (``ComparisonSpec.train_fn``, ``TuneSpec.train_fn``) adds its own module instead, which imports what it trains
    with (``__main__`` is the server's to import)."""
    module = getattr(getattr(train_fn, "func", train_fn), "__module__", None) or ""  # (a partial: its function)
    if train_fn is None or module.split(".")[:2] == ["bench", "engines"]:
        return POOL_PRELOAD + ENGINE_PRELOAD
    return POOL_PRELOAD + ([module] if module and module != "__main__" else [])


def pool_context(preload: list[str]):
    """A multiprocessing context whose processes fork from a forkserver that imported ``preload`` (else ``spawn``)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(preload)
    return ctx


def stop_forkserver(ctx) -> None:
    """End the pool's forkserver and reap it: a later pool starts its own (with this process's environment then),
    and the server's CPU and its workers' (which it reaped) count in this process's children's."""
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    with contextlib.suppress(Exception):  # (CPython's: every version with a forkserver has it)
        server._stop()
