"""Concurrency safety of the local MLflow store and of `bench run`'s (objective, seed) pairs.

Several processes write to one store: the workers of one `bench run` (a process pool), and two `bench run` /
`bench tune` commands started at once in the same folder. Two things break without coordination:

1. **Creating a fresh SQLite store.** MLflow creates its tables and then runs its alembic migrations on the first
   connection; two processes doing that at once corrupt the store (``table _alembic_tmp_... already exists``,
   ``Online migration expected to match one row``) and every later command in that folder fails.
   :func:`open_client` takes an exclusive file lock (``<db>.lock`` next to ``mlflow.db``) around the first
   connection of each process, so exactly one process creates and migrates the store and the others find it ready.
   Experiment creation (:func:`get_or_create_experiment`) happens under the same lock.
2. **Training one pair twice.** :func:`pair_lock` is an exclusive lock file per pair in the output folder
   (``<output_dir>/<experiment>/.locks/<run name>.lock``), held for the whole time the pair is trained. The harness
   decides reuse / resume / train only once it holds that lock, so a second process waits for the first (with a
   message), then reuses the FINISHED run.

The locks are ``fcntl`` locks (``filelock``), released by the kernel when a process dies, so a killed process never
leaves a stale lock behind; the empty lock files stay. Remote stores (``http(s)://``, PostgreSQL) need no creation
lock (the server or the database serializes it); pair claims work for any store, since they live in the output folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout

_READY: set[str] = set()  # URIs whose store this process has already opened under the lock


def store_lock_path(uri: str) -> Path | None:
    """The lock file that guards a local store's creation (``<db>.lock`` / ``<folder>.lock``); None if remote."""
    if uri.startswith("sqlite:"):
        from sqlalchemy.engine import make_url

        db = make_url(uri).database
        if not db or db == ":memory:":
            return None
        p = Path(db)
        return p.with_name(p.name + ".lock")
    if uri.startswith("file:") or "://" not in uri:  # MLflow's file store: a folder
        from urllib.parse import urlparse

        p = Path(urlparse(uri).path if uri.startswith("file:") else uri)
        return p.with_name(p.name + ".lock")
    return None


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Exclusive lock on a local store (a no-op for remote ones)."""
    path = store_lock_path(uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path)):
        yield


def open_client(uri: str):
    """An ``MlflowClient`` on ``uri`` whose store exists and is fully migrated.

    The first call of a process for a local store connects under :func:`store_lock`, so concurrent processes never
    create / migrate the same fresh store at once."""
    from mlflow import MlflowClient

    if uri in _READY or store_lock_path(uri) is None:
        return MlflowClient(tracking_uri=uri)
    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # the first connection: creates and migrates the store
    _READY.add(uri)
    return client


def get_or_create_experiment(client, uri: str, name: str) -> str:
    """The id of experiment ``name`` (restored if deleted, created if absent), safe against concurrent creators."""
    with store_lock(uri):
        exp = client.get_experiment_by_name(name)
        if exp is not None and exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(name)
        except Exception:  # a remote store: another process created it between the two calls
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


def locks_dir(output_dir: str | Path, experiment: str) -> Path:
    return Path(output_dir) / experiment / ".locks"


@contextlib.contextmanager
def pair_lock(path: str | Path, what: str, on_wait: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Hold the claim on one (objective, seed) pair. Yields True when the lock was free, False when this process had
    to wait for another one (``on_wait`` is told so, with the pair and the lock file, before it blocks)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    free = True
    try:
        lock.acquire(timeout=0)
    except Timeout:
        free = False
        if on_wait is not None:
            on_wait(f"{what} is being trained by another process (lock {path}); waiting for it to finish, "
                    "then its run is reused")
        lock.acquire()
    try:
        yield free
    finally:
        lock.release()
