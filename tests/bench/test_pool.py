"""The local pool of `bench run` / `bench tune` (bench/executors.py ``_Pool``): workers forked from a forkserver that
imported the training code once, the pool's own server, ended and reaped with the pool; a worker has the environment
and working folder of the process that made the pool, as a spawned one had."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

from bench.config import TrainConfig
from bench.engines import entry
from bench.executors import Job, LocalExecutor
from bench.workers import ENGINE_PRELOAD, POOL_PRELOAD, pool_preload
from tests.bench.fake_trainer import fake_train
from tests.conftest import fresh_store


def _where(notify, name: str) -> dict:
    """A job: what its worker process sees."""
    import multiprocessing
    import sys

    return {"env": os.environ.get(name), "cwd": os.getcwd(), "ppid": os.getppid(),
            "parent": multiprocessing.parent_process().pid,
            "preloaded": [m for m in pool_preload(fake_train) if m in sys.modules],
            "engine": [m for m in ENGINE_PRELOAD if m in sys.modules]}


def _opens_a_store(notify, uri: str) -> list[str]:
    """A job: opens the store as a pair does and writes to it; returns the packages it had to import for that."""
    import sys

    from bench.runs.tracking import store_client

    before = {m.split(".")[0] for m in sys.modules}
    store_client(uri).search_experiments()
    return sorted({m.split(".")[0] for m in sys.modules} - before)


def _children() -> set[int]:
    return {int(c) for c in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()}


def test_pool_workers_fork_from_a_preloaded_server_that_ends_with_the_pool(tmp_path, monkeypatch):
    from multiprocessing import forkserver

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POBENCH_TEST_POOL_VALUE", "set before the pool")
    before = _children()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    ex = LocalExecutor(workers=2)
    assert ex.start(2, TrainConfig(), {"train_fn": fake_train}) == 2  # (the stand-in trainer: no transformers)
    try:
        got = ex.run([Job(i, _where, ("POBENCH_TEST_POOL_VALUE",)) for i in range(2)]
                     + [Job(2, _opens_a_store, (fresh_store(tmp_path),))], lambda *e: None)
    finally:
        ex.close()
    # a worker opening MLflow's store imports nothing heavy: the server imported it (each import is seconds of CPU)
    assert not {"mlflow", "sqlalchemy", "alembic", "torch", "transformers"} & set(got.pop(2)), got
    assert {r["env"] for r in got.values()} == {"set before the pool"}
    assert {r["cwd"] for r in got.values()} == {str(tmp_path)}
    assert {r["parent"] for r in got.values()} == {os.getpid()}  # (the command, which its watch follows)
    servers = {r["ppid"] for r in got.values()}
    assert len(servers) == 1 and servers != {os.getpid()}, got  # forked by one server, not spawned by this process
    # imported by the server, before the fork: what the jobs' train_fn needs, not what pobench's engines would
    assert all(r["preloaded"] == pool_preload(fake_train) and not r["engine"] for r in got.values()), got
    # nothing of the pool outlives it (the next pool gets a server with the environment of its time), and the server
    # was reaped here: its CPU and its workers' (which it reaped) count as this process's children's
    assert forkserver._forkserver._forkserver_pid is None
    assert not (_children() - before) - {getattr(_tracker(), "_pid", None)}
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - cpu0 > 1.0


def _tracker():
    from multiprocessing import resource_tracker

    return resource_tracker._resource_tracker


def test_the_pool_server_imports_what_the_jobs_train_with():
    """pobench's engines (the default train_fn of `bench run` and `bench tune`) get the native loop and transformers'
    Llama preloaded; a notebook's or a test's train_fn its own module instead (the engines' ~3 CPU-seconds saved in
    each pool it makes); every name is a module that exists (the server skips one that does not, silently)."""
    import functools
    import importlib.util

    for fn in (None, entry.train):
        assert pool_preload(fn) == POOL_PRELOAD + ENGINE_PRELOAD
    assert pool_preload(fake_train) == pool_preload(functools.partial(fake_train, eval_fn=None)) == [
        *POOL_PRELOAD, "tests.bench.fake_trainer"]
    assert all(importlib.util.find_spec(m) is not None for m in POOL_PRELOAD + ENGINE_PRELOAD)


def test_a_stop_signal_while_the_pool_starts_its_workers_does_not_lose_one(monkeypatch):
    """Held-out round 12 (H04): `bench tune --workers 2` stopped by SIGINT as its pool started never ended: the
    interrupt came after the forkserver had made a worker and before the pool recorded it, so nobody told that worker
    to end; the forkserver waited for it and the command for the forkserver, forever. The pool's start is now a block a
    signal does not cut (``bench.runs.stop.uninterrupted``): the interrupt comes once the workers are recorded, and the
    pool ends. (The signal is sent here right after each worker's process starts, before the pool records it.)"""
    import signal
    import threading
    from multiprocessing import context, process

    from bench.executors import _Pool
    from bench.runs import stop

    monkeypatch.setitem(stop._RECEIVED, "signal", None)
    monkeypatch.setitem(stop._HELD, "pending", False)
    monkeypatch.setattr(signal, "SIGINT", signal.SIGINT)
    previous = signal.signal(signal.SIGINT, stop.interrupt)
    started, made = process.BaseProcess.start, []

    def start_then_signal(self):
        started(self)
        made.append(self.pid)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # (the handler runs here, before the pool records the process)
            pass

    monkeypatch.setattr(context.ForkServerProcess, "start", start_then_signal)
    pool = _Pool(2, [], ["bench.workers"])
    try:
        try:
            pool.submit(Job(0, _where, ("HOME",)), lambda *e: None)
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the signal was lost")
        assert stop.received() == signal.SIGINT
        assert made and set(made) <= set(pool.pool._processes or {}), "a worker started that the pool did not record"
        monkeypatch.setattr(context.ForkServerProcess, "start", started)
        ended = threading.Thread(target=pool.cancel, args=([],), daemon=True)
        ended.start()
        ended.join(60)
        assert not ended.is_alive(), "the pool did not end: a worker it never recorded keeps its forkserver waiting"
        deadline = time.time() + 30
        while made and time.time() < deadline:
            made[:] = [pid for pid in made if _alive(pid)]
            time.sleep(0.1)
        assert not made, f"worker process(es) {made} outlived the pool (never told to end)"
    finally:
        signal.signal(signal.SIGINT, previous)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # (a zombie waiting for its parent has ended)
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
