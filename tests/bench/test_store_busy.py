"""Ending a run while another process holds SQLite's write lock longer than MLflow waits for it: the write is
retried, not lost to a traceback.

Seen on Ctrl-C to `bench run --workers 2` on a loaded 2-core machine: both workers and the driver end their runs at
the same moment, and one of them got "database is locked" after MLflow's SQLite busy timeout (20 s). Here a plain
sqlite3 connection holds the write lock for 23 s.
"""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from mlflow import MlflowClient

from bench.runs.tracking import RunLogger
from reports.record import retry_locked
from tests.conftest import fresh_store

HOLD_S = 23.0  # longer than MLflow's SQLite busy timeout of 20 s


def _hold_write_lock(db: str, seconds: float, table: str = "experiments", column: str = "name") -> threading.Thread:
    conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")  # the write (RESERVED) lock, as another process's open write transaction holds it
    conn.execute(f"UPDATE {table} SET {column} = {column}")

    def release():
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    t = threading.Thread(target=release)
    t.start()
    return t


@pytest.fixture
def logger(tmp_path):
    uri = fresh_store(tmp_path)
    log = RunLogger(uri, "busy")
    log.start("r", {"pobench.kind": "train"}, {"a": "1"})
    return log, str(tmp_path / "mlflow.db"), uri


@pytest.mark.slow
def test_ending_a_run_under_a_held_lock_waits_and_succeeds_where_mlflow_alone_gives_up(logger):
    """One hold of the lock for both: the premise (MLflow's own call, on another run, fails after its busy timeout,
    so without the retry a run would not end) in a thread, and the run ended through RunLogger, which waits."""
    log, db, uri = logger
    other = log.client.create_run(log.experiment_id, run_name="plain").info.run_id
    holder = _hold_write_lock(db, HOLD_S)
    plain: list[BaseException | None] = []

    def mlflow_alone() -> None:
        try:
            MlflowClient(uri).set_terminated(other, status="KILLED")
            plain.append(None)
        except Exception as e:  # noqa: BLE001 (the premise: which error MLflow raises)
            plain.append(e)

    premise = threading.Thread(target=mlflow_alone)
    premise.start()
    log.log({"m": 1.0}, 1)
    log.flush()
    log.set_tags({"pobench.stopped": "early"})
    log.end("KILLED")
    holder.join()
    premise.join()
    assert plain and plain[0] is not None and "database is locked" in str(plain[0]), plain
    run = MlflowClient(uri).get_run(log.run_id)
    assert run.info.status == "KILLED" and run.data.tags["pobench.stopped"] == "early" and run.data.metrics["m"] == 1.0
    assert MlflowClient(uri).get_run(other).info.status == "RUNNING"


def test_retry_gives_up_after_its_attempts_and_passes_other_errors_at_once():
    calls = []

    def locked():
        calls.append(1)
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(sqlite3.OperationalError, match="locked"):
        retry_locked(locked, attempts=3, first_wait=0.01)
    assert len(calls) == 3

    def other():
        calls.append(2)
        raise ValueError("no such run")

    with pytest.raises(ValueError):
        retry_locked(other, attempts=3, first_wait=0.01)
    assert calls.count(2) == 1


def test_retry_sees_the_lock_under_optunas_storage_error():
    """Optuna's RDB storage raises StorageInternalError from SQLite's "database is locked" (its message does not say
    so): retried too (a stopped `bench tune --workers 2` lost one trial's re-queue to it)."""
    from optuna.exceptions import StorageInternalError

    calls = []

    def enqueue():
        calls.append(1)
        if len(calls) == 1:
            try:
                raise sqlite3.OperationalError("database is locked")
            except sqlite3.OperationalError as e:  # as optuna.storages._rdb.storage._create_scoped_session raises it
                raise StorageInternalError("An exception is raised during the commit.") from e
        return "queued"

    assert retry_locked(enqueue, attempts=3, first_wait=0.01) == "queued" and len(calls) == 2


@pytest.mark.parametrize("write", ["best-trial", "dead-worker"])
def test_a_tag_another_process_inserts_between_mlflows_read_and_insert_is_written_not_raised(tmp_path, write):
    """Every worker of one `bench tune` study writes the study run's best-trial tags as it ends, and any worker that
    finds a dead worker's trial marks its run. MLflow's ``set_tag`` reads the row, then inserts it; another worker's
    insert of the same tag between the two made the first fail on the tags table's primary key (CI: a traceback out
    of `bench tune --workers 2`). Here the other worker's insert is made, through its own connection, exactly there
    (the moment the first insert goes to SQLite): the tags end written, with this worker's values. (best-trial: one
    batch, which MLflow itself writes again; dead-worker: tag by tag, written again by ``retry_locked``.)"""
    import optuna
    from sqlalchemy import event

    from bench.tune.runs import StudyRuns
    from reports.record import BEST_TRIAL, BEST_VALUE, FAIL_REASON, TRIAL_STATE

    uri = fresh_store(tmp_path)
    runs = StudyRuns(uri, "busy", "st")
    runs.parent_id = runs.client.create_run(runs.experiment_id, run_name="tune-st").info.run_id
    study = optuna.create_study(storage=None)
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=1)
    trial_run = runs.client.create_run(runs.experiment_id, run_name="trial-0").info.run_id
    dead = study.trials[0]  # (a copy: as the heartbeat check gets it)
    dead.user_attrs["mlflow_run_id"] = trial_run
    target = runs.parent_id if write == "best-trial" else trial_run
    raced: list[str] = []

    def other_worker_first(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO TAGS") and not raced:
            row = parameters[0] if executemany else parameters  # (a batch of tags: one statement, many rows)
            key = row[0] if isinstance(row, tuple) else row["key"]
            raced.append(key)
            with sqlite3.connect(str(tmp_path / "mlflow.db"), timeout=5) as other:
                other.execute("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                              (key, "the other worker's", target))

    engine = runs.client._client._tracking_client.store.engine
    event.listen(engine, "before_cursor_execute", other_worker_first)
    try:
        if write == "best-trial":
            runs.finish_parent(study, None, complete=True)
        else:
            runs.close_stale_trial(study, dead)
    finally:
        event.remove(engine, "before_cursor_execute", other_worker_first)
    run = MlflowClient(uri).get_run(target)
    if write == "best-trial":
        assert raced == [BEST_TRIAL]  # the race happened, on the first tag written
        assert run.data.tags[BEST_TRIAL] == "0" and run.data.tags[BEST_VALUE] == f"{study.best_value:.6g}"
        assert run.data.tags["best.x"] == str(study.best_params["x"]) and run.info.status == "FINISHED"
    else:
        assert raced == [TRIAL_STATE]
        assert run.data.tags[TRIAL_STATE] == "FAIL" and run.data.tags[FAIL_REASON] == "worker heartbeat lost"
        assert run.info.status == "FAILED"


def test_two_pairs_logging_one_new_dataset_at_once_is_retried(tmp_path):
    """tests/bench/test_plugins.py (a `bench run` of 2 spawned workers, one plugin task, under `pytest -n 2`): both
    pairs logged their common dataset at once and
    the slower insert failed on MLflow's datasets primary key (`UNIQUE constraint failed: datasets.experiment_id,
    datasets.name, datasets.digest`): the pair failed with MLflow's traceback. That error (made here by SQLite on a
    real store's table) is retried as a lost tag insert is: called again, MLflow finds the row."""
    import sqlalchemy

    uri = fresh_store(tmp_path)
    engine = sqlalchemy.create_engine(uri)
    row = ("insert into datasets (dataset_uuid, experiment_id, name, digest, dataset_source_type, dataset_source) "
           "values (:u, 0, 'gsm8k-train', 'abc', 'local', '{}')")
    with engine.begin() as con:
        con.execute(sqlalchemy.text(row), {"u": "a"})
    with pytest.raises(sqlalchemy.exc.IntegrityError) as raced:
        with engine.begin() as con:
            con.execute(sqlalchemy.text(row), {"u": "b"})
    engine.dispose()
    calls = []

    def log_inputs():
        calls.append(1)
        if len(calls) == 1:
            raise raced.value
        return "logged"

    assert retry_locked(log_inputs, attempts=3, first_wait=0.01) == "logged" and len(calls) == 2
