"""Concurrency safety of the local MLflow store and of `bench run`'s (objective, seed) pairs.

Several processes write to one store: the workers of one `bench run` (a process pool), and two `bench run` /
`bench tune` commands started at once in the same folder. Two things break without coordination:

1. **Creating a fresh SQLite store.** MLflow creates its tables and then runs its alembic migrations on the first
   connection; two processes doing that at once corrupt the store (``table _alembic_tmp_... already exists``,
   ``Online migration expected to match one row``) and every later command in that folder fails.
   ``reports.record.open_client`` takes an exclusive file lock (``<db>.lock`` next to ``mlflow.db``) around the first
   connection of each process, so exactly one process creates and migrates the store and the others find it ready.
   Experiment creation (``reports.record.get_or_create_experiment``) happens under the same lock. Both live in
   ``reports/record.py``, the MLflow record module (``bench report`` opens the store too).
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

from bench.runs.run import experiment_dir
from reports.paths import lock_file as _lock_file
from reports.paths import make_lock_folder

__all__ = ["lock_file", "pair_lock"]


def lock_file(output_dir: str | Path, experiment: str, name: str) -> Path:
    """``<output_dir>/<experiment>/.locks/<name>.lock``: ``name`` (a pair's run name, made of an objective name)
    through the one containment helper, so the lock file stays in ``.locks`` whatever the name."""
    return _lock_file(experiment_dir(output_dir, experiment), name)


@contextlib.contextmanager
def pair_lock(path: str | Path, what: str, on_wait: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Hold the claim on one (objective, seed) pair. Yields True when the lock was free, False when this process had
    to wait for another one (``on_wait`` is told so, with the pair and the lock file, before it blocks)."""
    path = make_lock_folder(path)
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
