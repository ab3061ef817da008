"""`bench tune` after the faults of issue 29, as a user meets them: real processes, a real SQLite storage and MLflow
store, a real PostgreSQL server (tests/pg.py); the trainer is the injected fake one (tests/bench/fake_trainer.py:
the study, its storage, its MLflow runs and the processes are real). No run may be left RUNNING and no traceback
printed."""

from __future__ import annotations

import os
import signal

import optuna
import pytest

from tests.bench import fake_trainer
from tests.bench.test_signals import FAKE_CLI, Proc, checkpointed, statuses
from tests.conftest import fresh_store


def _argv(tmp_path, storage: str, uri: str, steps: int = 30, trials: int = 2) -> list[str]:
    return ["tune", "--algo", "grpo", "--trials", str(trials), "--steps", str(steps), "--seeds", "0", "--study", "st",
            "--storage", storage, "--tracking-uri", uri, "--experiment", "tx", "--out", "out", "--eval-every", "5",
            "--samples-every", "0", "--sampler-seed", "0", "--checkpoint-every", "1", "--workers", "1"]


@pytest.mark.slow
def test_a_sigkilled_bench_tune_then_the_same_command_at_once_leaves_no_run_running(tmp_path, bench_here,
                                                                                     monkeypatch):
    """Issue 29: `bench tune` SIGKILLed mid-trial, then the same command at once (the dead trial's heartbeat not yet
    stale) finished with exit 0 while the killed trial's MLflow run and its training run stayed RUNNING. The trial's
    worker holds a lock while it runs the trial, which the kernel releases when it dies: the rerun sees at once that
    its process is gone, fails and re-queues it, and ends its runs FAILED."""
    uri = fresh_store(tmp_path)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    argv = _argv(tmp_path, storage, uri)
    proc = Proc([*FAKE_CLI, *argv], tmp_path, FAKE_STEP_S="0.3")
    proc.wait_for(lambda: checkpointed(tmp_path / ".pobench" / "runs"), "the first trial's checkpoint")
    os.killpg(proc.p.pid, signal.SIGKILL)
    proc.finish(timeout=60)
    assert "RUNNING" in statuses(uri, "tx", "tune-trial")  # what the kill left
    fake_trainer.inject(monkeypatch.setattr)
    rc, _, err = bench_here(argv, tmp_path, FAKE_STEP_S="0")  # at once: well within the heartbeat's grace (120 s)
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    assert "RUNNING" not in statuses(uri, "tx"), statuses(uri, "tx")
    study = optuna.load_study(study_name="st", storage=storage)
    states = [t.state.name for t in study.trials]
    assert states[0] == "FAIL" and states.count("COMPLETE") >= 2 and "RUNNING" not in states, states
    assert study.trials[0].params in [t.params for t in study.trials[1:]]  # queued again with its parameters


@pytest.mark.slow
def test_the_optuna_postgresql_storage_lost_mid_study_is_one_line_and_ends_the_study_run(tmp_path):
    """Issue 29: the Optuna PostgreSQL server stopping mid-study gave a traceback and left the study's MLflow run
    RUNNING. Now: one line naming the storage (password hidden), the cause and what to do, exit 1; the study run, the
    trial run and its training run are ended FAILED."""
    from tests import pg

    reason = pg.unavailable_reason()
    if reason:
        pytest.skip(reason)
    uri = fresh_store(tmp_path)
    with pg.PostgresServer() as server:
        storage = server.create_database("optuna")
        proc = Proc([*FAKE_CLI, *_argv(tmp_path, storage, uri)], tmp_path, FAKE_STEP_S="0.3")
        proc.wait_for(lambda: checkpointed(tmp_path / ".pobench" / "runs"), "the first trial's checkpoint")
        server._run("pg_ctl", "-D", str(server.data), "-m", "immediate", "-w", "stop")
        rc = proc.finish(timeout=300)
    assert rc == 1, proc.text()
    lines = [ln for ln in proc.err if ln.strip() and not ln.startswith("[")]
    assert "Traceback" not in proc.text() and len(lines) == 1, proc.text()
    assert lines[0].startswith("bench tune: stopped: the Optuna storage ") and "127.0.0.1" in lines[0], lines[0]
    assert "RUNNING" not in statuses(uri, "tx"), statuses(uri, "tx")
    assert statuses(uri, "tx", "tune-study") == ["FAILED"]


def _create_storages(folder: str, rounds: int, barrier) -> list[str]:
    """A process that opens a fresh storage ``folder/o<i>.db`` for each round, at the same moment as the others."""
    from bench.tune.storage import open_storage

    failures = []
    for i in range(rounds):
        try:  # (a bounded wait: a process that failed must not leave the others, and the pool's shutdown, waiting)
            barrier.wait(timeout=120)
            open_storage(f"sqlite:///{folder}/o{i}.db")
        except Exception as e:  # noqa: BLE001  (whatever it is, the test reports it)
            failures.append(f"round {i}: {type(e).__name__}: {e}")
            barrier.abort()  # (the others stop waiting at once)
            break
    return failures


@pytest.mark.slow
def test_bench_tunes_started_at_once_on_a_fresh_sqlite_storage_create_it_once(tmp_path):
    """Issue 29: three `bench tune` started at once on a fresh SQLite storage raced on creating its tables (`UNIQUE
    constraint failed: alembic_version.version_num`, one line but the command failed). The first connection is made
    under the storage's lock file (as the MLflow store's), so exactly one process creates the tables. Three spawned
    processes, ten fresh storages each opened by all three at the same moment."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(3, mp_context=ctx) as pool:
        barrier = manager.Barrier(3)
        done = [pool.submit(_create_storages, str(tmp_path), 10, barrier) for _ in range(3)]
        failures = [f for d in done for f in d.result(timeout=600)]
    assert not failures, failures[:3]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["store", "storage"])
def test_a_store_or_storage_deleted_while_the_study_runs_is_one_line_not_exit_0(tmp_path, which):
    """Round 7 of issue 29: `rm mlflow.db` (or the Optuna SQLite storage) while `bench tune` ran: the study went on
    writing into the deleted file through its open connections and ended with exit 0, its leaderboard and outputs,
    every run and trial it recorded lost without a word. Now one line naming the file, exit 1."""
    uri = fresh_store(tmp_path)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    proc = Proc([*FAKE_CLI, *_argv(tmp_path, storage, uri, steps=8)], tmp_path, FAKE_STEP_S="0.3")
    proc.wait_for(lambda: checkpointed(tmp_path / ".pobench" / "runs"), "the first trial's checkpoint")
    victim = tmp_path / ("mlflow.db" if which == "store" else "optuna.db")
    victim.unlink()
    rc = proc.finish(timeout=300)
    what = "the MLflow store" if which == "store" else "the Optuna storage"
    assert rc == 1, proc.text()
    assert "Traceback" not in proc.text(), proc.text()
    assert any(ln.startswith(f"bench tune: stopped: {what} {victim} was deleted while the study ran")
               for ln in proc.err), proc.text()


def test_a_read_only_optuna_storage_is_named_read_only_not_unreachable(tmp_path):
    """Issue 29 (C10): Optuna's storage refusing every write (read-only) was told "once it answers again", as if it were
    unreachable: the line now says read-only and what to do. A real SQLite storage, opened read-only (SQLite's URI
    `mode=ro`: as root a chmod does not stop writes), and a trial's write to it."""
    import optuna

    from bench import faults

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    db = tmp_path / "optuna.db"
    optuna.create_study(storage=f"sqlite:///{db}", study_name="s").optimize(lambda t: t.suggest_float("x", 0, 1), 1)
    read_only = optuna.storages.RDBStorage(f"sqlite:///file:{db}?mode=ro&uri=true")
    with pytest.raises(Exception) as got:
        optuna.load_study(study_name="s", storage=read_only).optimize(lambda t: t.suggest_float("x", 0, 1), 1)
    line = faults.describe(got.value, storage=f"sqlite:///{db}")
    assert line == (f"the Optuna storage sqlite:///{db} is read-only (attempt to write a readonly database): make the "
                    "file and its folder writable, then rerun the same command (the finished trials are kept in it)")
    # the same error met by a running study (bench/tune/study.py ``storage_lost``): its line says it too
    from bench.tune.study import storage_lost

    class Runs:
        def fail_open(self, why):
            return "its runs were ended FAILED"

    stopped = str(storage_lost(type("Spec", (), {"storage": f"sqlite:///{db}"})(), Runs(), got.value))
    assert "the storage is read-only (attempt to write a readonly database): make the file and its folder " \
           "writable, then rerun the same command" in stopped and "answers again" not in stopped, stopped
