"""A trainer for the stop tests of `bench tune --workers N` (held-out round 13, H17): the fake trainer
(tests/bench/fake_trainer.py), which, in a pool worker, sends SIGTERM to the command and to its own process from
inside the first commit to the Optuna storage once its trial trains (the trial's first evaluation report): the stop a
scheduler sends to the whole process group, landing where a worker writes to the storage. A module of its own, small:
the pool's server preloads it (``bench.workers.pool_preload``)."""

from __future__ import annotations

import multiprocessing
import os
import signal

from tests.bench import fake_trainer

_ARMED = {"on": False, "listening": False}


def _signal_in_the_commit(conn) -> None:
    if _ARMED["on"] and str(conn.engine.url).endswith("optuna.db"):
        _ARMED["on"] = False
        parent = multiprocessing.parent_process()
        if parent is not None and _first_to_signal_the_parent():
            os.kill(parent.pid, signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # (its handler raises here, inside the commit, unless held)


def _first_to_signal_the_parent() -> bool:
    """Whether this worker is the first of the pool to signal the command (``COMMIT_SIGNAL_ONCE``: a file made once;
    unset: every worker signals it)."""
    flag = os.environ.get("COMMIT_SIGNAL_ONCE")
    if not flag:
        return True
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def train(cfg, **kw):
    """``fake_trainer.fake_train``, armed to send the stop at this process's next commit to the Optuna storage."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not _ARMED["listening"]:
        event.listen(Engine, "commit", _signal_in_the_commit)
        _ARMED["listening"] = True
    _ARMED["on"] = True
    return fake_trainer.fake_train(cfg, **kw)
