"""Held-out round 13's `bench tune` cases (issue 29), as the user ran them: H07 (the MLflow server hung when the
study was stopped: the rerun ends the interrupted trial's runs), H17 (`--workers 2` stopped while both train: bounded,
no worker left), H09 (the SQLite storage locked by another process), H26 (a file at ``.pobench/tune``). The trainer is
the injected fake one (tests/bench/fake_trainer.py); the study, its storage, its MLflow runs and the processes are
real."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import optuna
import pytest

from tests.bench import fake_trainer
from tests.bench.test_held_out_faults import _lines
from tests.bench.test_signals import FAKE_CLI, Proc, fresh_stop, statuses  # noqa: F401
from tests.conftest import MlflowServer, fresh_store


def _argv(storage: str, uri: str, *extra: str) -> list[str]:
    return ["tune", "--algo", "grpo", "--trials", "2", "--steps", "30", "--seeds", "0", "--study", "st",
            "--storage", storage, "--tracking-uri", uri, "--experiment", "tx", "--out", "out", "--eval-every", "5",
            "--samples-every", "0", "--sampler-seed", "0", "--checkpoint-every", "0", *extra]


# ------------------------------------------------------------------ H07: the MLflow server hung as the study stopped
@pytest.mark.slow
def test_h07_the_rerun_ends_the_runs_whose_end_the_hung_server_did_not_take(tmp_path, bench_here, monkeypatch):
    """Held-out round 13 (H07): the MLflow server SIGSTOPped during `bench tune`, SIGTERM; after SIGCONT the same
    command finished (rc 0), but the interrupted trial's run and its training run stayed RUNNING for good, although
    the training run's folder recorded its end (``unsent_end``). Now the rerun applies the recorded end and ends the
    trial's run: no run is RUNNING."""
    server = MlflowServer(tmp_path)
    server.start()
    try:
        storage = f"sqlite:///{tmp_path}/optuna.db"
        argv = _argv(storage, server.uri, "--workers", "1")
        proc = Proc([*FAKE_CLI, *argv], tmp_path, FAKE_STEP_S="0.2", POBENCH_MLFLOW_TIMEOUT="1")
        record = tmp_path / ".pobench" / "runs" / "st-t0-s0" / "run.json"
        proc.wait_for(record.is_file, "the first trial's training run")
        server.hang()
        os.killpg(proc.p.pid, signal.SIGTERM)
        try:
            assert proc.finish(timeout=120) in (1, 143), proc.text()
        finally:
            server.go_on()
        assert json.loads(record.read_text()).get("unsent_end"), proc.text()  # (what the user's folder held)
        assert "RUNNING" in statuses(server.uri, "tx", "tune-trial")  # what the stop left
        fake_trainer.inject(monkeypatch.setattr)
        rc, _, err = bench_here(argv, tmp_path, FAKE_STEP_S="0")
        assert rc == 0 and "Traceback" not in err, err[-3000:]
        assert "RUNNING" not in statuses(server.uri, "tx"), statuses(server.uri, "tx")
        assert "unsent_end" not in json.loads(record.read_text())
    finally:
        with contextlib.suppress(Exception):
            server.stop()


# ------------------------------------------------------------------ H17: a stop signal inside a storage write
@pytest.mark.usefixtures("fresh_stop")  # (the signal this test sends is forgotten after it)
def test_h17_a_stop_signal_inside_a_storage_write_leaves_the_storage_unlocked_and_stops_in_seconds(
        tmp_path, bench_here, monkeypatch):
    """Held-out round 13 (H17): SIGTERM to `bench tune --workers 2` while both workers trained: exit 143 only after
    79 s, both workers left alive deadlocked re-queueing their trial in the SQLite storage, holding it locked. A
    signal that lands while a worker writes to the storage (here: as the trial's first evaluation is committed)
    raised out of SQLAlchemy's commit and left that connection's write lock held by the process: its own re-queue
    then waited SQLite's busy timeout, again and again. Now each storage call is whole under a stop signal (as the
    MLflow store's are): exit 143 within seconds, the trial queued again, no run RUNNING, the storage free."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    uri = fresh_store(tmp_path)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    fake_trainer.inject(monkeypatch.setattr)
    real, armed = fake_trainer.fake_train, {"on": False}

    def train(cfg, **kw):
        armed["on"] = True
        return real(cfg, **kw)

    def signal_in_the_commit(conn):
        if armed["on"] and str(conn.engine.url).endswith("optuna.db"):
            armed["on"] = False
            os.kill(os.getpid(), signal.SIGTERM)  # (the handler raises here, inside the commit: a real stop)

    monkeypatch.setattr(fake_trainer, "fake_train", train)
    event.listen(Engine, "commit", signal_in_the_commit)
    try:
        start = time.monotonic()
        rc, _, err = bench_here(_argv(storage, uri, "--workers", "1", "--steps", "2", "--eval-every", "1"), tmp_path)
        took = time.monotonic() - start
    finally:
        event.remove(Engine, "commit", signal_in_the_commit)
    lines = [ln for ln in _lines(err) if not ln.startswith("[")]
    assert rc == 143 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert took < 15, f"{took:.0f} s"
    assert "kept 0 of 2 trials finished of study 'st'" in lines[0] and "queued again" in lines[0], lines
    assert "RUNNING" not in statuses(uri, "tx"), statuses(uri, "tx")
    study = optuna.load_study(study_name="st", storage=storage)
    assert sorted(t.state.name for t in study.trials) == ["FAIL", "WAITING"]
    with sqlite3.connect(tmp_path / "optuna.db", timeout=1) as db:  # (nothing holds it locked)
        db.execute("BEGIN IMMEDIATE")


# ------------------------------------------------------------------ H09: the SQLite storage locked by another process
LOCKER = """import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
time.sleep(120)
"""


def test_h09_a_sqlite_storage_another_process_keeps_locked_is_said_to_be_locked(tmp_path, bench_here):
    """Held-out round 13 (H09): an `sqlite3` shell holding ``BEGIN EXCLUSIVE`` on the Optuna storage: after 67 s
    "--storage ...: cannot be reached: (sqlite3.OperationalError) database is locked", rc 2, nothing on what to do.
    Now one line saying another process keeps it locked and what to do, exit 2 within seconds, nothing made."""
    from tests import launch

    locker = launch.Popen([sys.executable, "-c", LOCKER, str(tmp_path / "st.db")], stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "held"
        before = sorted(p.name for p in tmp_path.iterdir())
        start = time.monotonic()
        rc, _, err = bench_here(["tune", "--algo", "grpo", "--trials", "2", "--steps", "2", "--study", "s1",
                                 "--storage", "sqlite:///st.db"], tmp_path)
        took = time.monotonic() - start
    finally:
        locker.kill()
        locker.wait()
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "--storage sqlite:///st.db:" in lines[0] and "locked by another process" in lines[0], lines
    assert "cannot be reached" not in lines[0] and "let that process finish" in lines[0], lines
    assert took < 30, f"{took:.0f} s"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# ------------------------------------------------------------------ H26: a file at .pobench/tune
def test_h26_a_file_where_the_default_storage_and_outputs_go_is_refused_before_any_work(tmp_path, bench_here):
    """Held-out round 13 (H26): a user's file at ``.pobench/tune`` (where the default Optuna storage and outputs
    go): "stopped: ...: File exists (something not pobench's is in the way); move it away", exit 1, worded as a
    fault met during the work. Now refused before any work, exit 2, one line naming the path; the file kept."""
    (tmp_path / ".pobench").mkdir()
    (tmp_path / ".pobench" / "tune").write_text("mine\n")
    rc, _, err = bench_here(["tune", "--algo", "grpo", "--trials", "1", "--steps", "2"], tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert f"{tmp_path / '.pobench' / 'tune'}: not a folder" in lines[0] and "move it away" in lines[0], lines
    assert "--storage and --out" in lines[0], lines
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [".pobench", ".pobench/tune"]
    assert (tmp_path / ".pobench" / "tune").read_text() == "mine\n"


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_stop")
def test_h17_two_workers_stopped_inside_their_storage_writes_end_in_seconds(tmp_path, bench_here, monkeypatch):
    """H17 as the user met it: `bench tune --workers 2` (SQLite storage) stopped by a SIGTERM to the command and its
    workers, the workers' own landing inside a commit to the storage (tests/bench/commit_signal.py): exit 143 within
    seconds, each trial that trained failed and queued again, no run RUNNING, the storage free. The command's process
    is this test's (``bench_here``): the workers signal it once between them (``COMMIT_SIGNAL_ONCE``), as a
    scheduler's SIGTERM to the group reaches each process once; a second one after the command returned would end
    this process (pytest's worker), whose SIGTERM handler is the default again."""
    import dataclasses

    from bench import tune
    from tests.bench import commit_signal

    uri = fresh_store(tmp_path)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    real = tune.run_workers
    monkeypatch.setattr(tune, "run_workers", lambda spec, *a, **kw: real(
        dataclasses.replace(spec, train_fn=commit_signal.train), *a, **kw))
    start = time.monotonic()
    rc, _, err = bench_here(_argv(storage, uri, "--workers", "2"), tmp_path, FAKE_STEP_S="0.2",
                            COMMIT_SIGNAL_ONCE=str(tmp_path / "parent-signalled"))
    took = time.monotonic() - start
    lines = [ln for ln in _lines(err) if not ln.startswith("[")]
    assert rc == 143 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert took < 30, f"{took:.0f} s"
    assert "queued again" in lines[0], lines
    assert "RUNNING" not in statuses(uri, "tx"), statuses(uri, "tx")
    trials = optuna.load_study(study_name="st", storage=storage).trials
    detail = [(t.number, t.state.name, t.params, t.user_attrs) for t in trials]
    assert not [t for t in trials if t.state.name == "RUNNING"], detail
    # each trial that trained is queued again with its parameters; a trial the stop met between Optuna taking it and
    # its setup (no parameters drawn, nothing trained: `bench.tune.storage.fail_unstarted`) has nothing to queue
    trained = sorted(t.user_attrs["origin_trial"] for t in trials if t.state.name == "FAIL" and t.params)
    queued = sorted(t.user_attrs["origin_trial"] for t in trials if t.state.name == "WAITING")
    assert trained and trained == queued, detail
    assert all(not t.user_attrs for t in trials if t.state.name == "FAIL" and not t.params), detail
    with sqlite3.connect(tmp_path / "optuna.db", timeout=1) as db:
        db.execute("BEGIN IMMEDIATE")
