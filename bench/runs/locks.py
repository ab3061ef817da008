"""A training process's lock on its run folder: two processes writing checkpoints into one folder would mix two runs
(a resume could continue the other's). The lock file is ``<parent>/.locks/<run folder>.run.lock``, beside `bench run`'s
pair locks and outside the folder (which ``--force`` deletes); ``fcntl`` locks, released by the kernel when the
holder dies. Used inside ``bench/runs`` only: ``lifecycle`` takes it when a run opens and names it to callers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from reports.paths import make_lock_folder


class RunFolderBusy(ValueError):
    """Another process is training a run in this run folder now (one line; exit 2)."""


def folder_lock_path(run_dir: Path) -> Path:
    """The lock a training process holds on its run folder while its MLflow run is open:
    ``<parent>/.locks/<run folder>.run.lock`` (beside `bench run`'s pair locks; outside the folder, which
    ``--force`` deletes)."""
    return Path(run_dir).parent / ".locks" / f"{Path(run_dir).name}.run.lock"


def folder_in_use(run_dir: Path) -> bool:
    """True when a process holds ``run_dir``'s run lock now (it trains a run there)."""
    if not folder_lock_path(run_dir).exists():
        return False
    try:
        _hold_folder(run_dir).release()
    except RunFolderBusy:
        return True
    return False


@contextlib.contextmanager
def folder_held(run_dir: Path) -> Iterator[None]:
    """Inside, no training can start in ``run_dir`` (its run lock held); RunFolderBusy when one runs there now."""
    lock = _hold_folder(run_dir)
    try:
        yield
    finally:
        lock.release()


def _hold_folder(run_dir: Path) -> FileLock:
    """Take ``run_dir``'s run lock, or RunFolderBusy: two processes writing checkpoints into one folder would mix
    two runs (a resume could continue the other's). ``fcntl`` locks: released by the kernel when the holder dies."""
    path = make_lock_folder(folder_lock_path(run_dir))
    lock = FileLock(str(path), thread_local=False)  # (held by the run, whichever thread ends it)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise RunFolderBusy(f"{run_dir} is in use: another process is training a run there now (lock {path}); wait "
                            "for it to end, or choose another --run-name / --output-dir") from None
    return lock
