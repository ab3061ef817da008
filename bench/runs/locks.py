"""A training process's lock on its run folder: two processes writing checkpoints into one folder would mix two runs
(a resume could continue the other's). The lock file is ``<parent>/.locks/<run folder>.run.lock``, beside `bench run`'s
pair locks and outside the folder (which ``--force`` deletes); ``fcntl`` locks, released by the kernel when the
holder dies. Used inside ``bench/runs`` only: ``lifecycle`` takes it when a run opens and names it to callers.
``hold_out_folder``: the same kind of hold on a command's output folder (`bench eval --out`, `bench report`'s
comparison folder), for its commands."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout


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
    path = folder_lock_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), thread_local=False)  # (held by the run, whichever thread ends it)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise RunFolderBusy(f"{run_dir} is in use: another process is training a run there now (lock {path}); wait "
                            "for it to end, or choose another --run-name / --output-dir") from None
    return lock


class OutFolderBusy(ValueError):
    """Another command writes into this output folder now (one line; exit 2, before any work)."""


def hold_out_folder(out: Path, command: str, flag: str = "--out") -> FileLock:
    """Hold output folder ``out`` for `bench <command>` until the returned lock is released
    (``<parent>/.locks/<name>.<command>.lock``, outside the folder, as a run folder's; the holder's process id beside
    it in ``<lock>.pid``), or OutFolderBusy naming the folder and the process that holds it: two commands writing
    one folder at once each said it wrote its results there, and one's were silently lost (held-out round 11, H17).
    Take it after the folder's own checks (a file in its place, a user's folder): a refused command makes nothing."""
    import os

    path = Path(out).parent / ".locks" / f"{Path(out).name}.{command}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    pid = path.with_name(path.name + ".pid")
    lock = FileLock(str(path), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            who = f"process {int(pid.read_text().split()[0])}"
        except (OSError, ValueError, IndexError):
            who = "another process"
        raise OutFolderBusy(f"{flag} {out}: another bench {command} ({who}) is writing there now (lock {path}); wait "
                            f"for it to end, or give another {flag}") from None
    try:
        pid.write_text(f"{os.getpid()}\n")
    except OSError:  # (the process named is a courtesy: the lock holds without it)
        pass
    return lock
