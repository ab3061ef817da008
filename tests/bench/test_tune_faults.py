"""`bench tune` after the faults of issue 29, as a user meets them: real processes, a real SQLite storage and MLflow
store, a real PostgreSQL server (tests/pg.py); the trainer is the injected fake one (tests/bench/fake_trainer.py:
the study, its storage, its MLflow runs and the processes are real). No run may be left RUNNING and no traceback
printed."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import optuna
import pytest

from tests.bench import fake_trainer
from tests.bench.test_held_out_faults import TINY, _lines
from tests.bench.test_signals import FAKE_CLI, Proc, checkpointed, statuses
from tests.conftest import forkserver_context, fresh_store


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
def test_the_optuna_postgresql_storage_lost_mid_study_is_one_line_and_ends_the_study_run(tmp_path, bench_here,
                                                                                         monkeypatch):
    """Issue 29: the Optuna PostgreSQL server stopping mid-study gave a traceback and left the study's MLflow run
    RUNNING. Now: one line naming the storage (password hidden), the cause and what to do, exit 1; the study run, the
    trial run and its training run are ended FAILED. Held-out round 9 (H29): with the server back, the same command
    exited 0 leaving the lost trial RUNNING in the storage for good; now it fails the trial and queues it again."""
    from tests import pg

    reason = pg.unavailable_reason()
    if reason:
        pytest.skip(reason)
    uri = fresh_store(tmp_path)
    with pg.PostgresServer() as server:
        storage = server.create_database("optuna")
        argv = _argv(tmp_path, storage, uri)
        proc = Proc([*FAKE_CLI, *argv], tmp_path, FAKE_STEP_S="0.3")
        proc.wait_for(lambda: checkpointed(tmp_path / ".pobench" / "runs"), "the first trial's checkpoint")
        server._run("pg_ctl", "-D", str(server.data), "-m", "immediate", "-w", "stop")
        rc = proc.finish(timeout=300)
        assert rc == 1, proc.text()
        lines = [ln for ln in proc.err if ln.strip() and not ln.startswith("[")]
        assert "Traceback" not in proc.text() and len(lines) == 1, proc.text()
        assert lines[0].startswith("bench tune: stopped: the Optuna storage ") and "127.0.0.1" in lines[0], lines[0]
        assert "RUNNING" not in statuses(uri, "tx"), statuses(uri, "tx")
        assert statuses(uri, "tx", "tune-study") == ["FAILED"]
        server.serve()  # the server back: the same command (steps cut by FAKE_STEP_S=0, in this process)
        fake_trainer.inject(monkeypatch.setattr)
        rc, _, err = bench_here(argv, tmp_path, FAKE_STEP_S="0")
        assert rc == 0, err[-3000:]
        trials = optuna.load_study(study_name="st", storage=storage).trials
        states = [t.state.name for t in trials]
        assert states[0] == "FAIL" and "RUNNING" not in states and states.count("COMPLETE") == 2, states
        assert trials[0].params in [t.params for t in trials[1:]]  # queued again with its parameters


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
    under the storage's lock file (as the MLflow store's), so exactly one process creates the tables. Three processes,
    ten fresh storages each opened by all three at the same moment. (The three are forked from a forkserver that
    imported `bench.tune` once, instead of three spawned processes importing it each: ~3 CPU-seconds each; separate
    processes all the same, the subject, each with its own connections and lock file handles.)"""
    from concurrent.futures import ProcessPoolExecutor

    with forkserver_context("bench.tune.storage", __name__) as ctx, ctx.Manager() as manager, \
            ProcessPoolExecutor(3, mp_context=ctx) as pool:
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


# ------------------------------------------------------------------ a damaged Optuna storage
def test_a_damaged_optuna_sqlite_file_is_said_to_be_damaged(tmp_path, bench_here):
    fresh_store(tmp_path)
    (tmp_path / "study.db").write_bytes(b"these are my notes, not a database\n" * 50)
    before = (tmp_path / "study.db").read_bytes()
    rc, _, err = bench_here(["tune", "--algo", "grpo", "--storage", "sqlite:///study.db", "--trials", "1", *TINY[:-2],
                             "--eval-every", "1"], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1, err[-3000:]
    assert "not an SQLite database" in err and "cannot be reached" not in err and "answers again" not in err
    assert (tmp_path / "study.db").read_bytes() == before


def test_a_storage_damaged_mid_study_is_not_told_to_wait_for_it():
    import sqlite3

    from optuna.exceptions import StorageInternalError

    from bench import faults

    try:
        try:
            raise sqlite3.DatabaseError("database disk image is malformed")
        except sqlite3.DatabaseError as e:
            raise StorageInternalError("An exception is raised during the commit.") from e
    except StorageInternalError as e:
        line = faults.describe(e, store="sqlite:///mlflow.db", storage="sqlite:///study.db")
    assert "Optuna storage sqlite:///study.db is damaged" in line and "answers again" not in line
    assert "MLflow" not in line


# ------------------------------------------------------------------ a bench tune worker killed
def _pool_workers(pid: int) -> list[int]:
    """The pool processes of process ``pid``: those its forkserver forked (bench/executors.py), or those it spawned
    where there is no forkserver; not its multiprocessing resource tracker."""
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"forkserver import main" in cmd:
            out += [int(c) for c in Path(f"/proc/{child}/task/{child}/children").read_text().split()]
        elif b"spawn_main" in cmd:
            out.append(int(child))
    return out


@pytest.mark.slow
def test_a_killed_bench_tune_worker_is_one_line_and_the_same_command_finishes_the_study(tmp_path, bench_here,
                                                                                        monkeypatch):
    """Held-out round 3: `bench tune --workers 2` whose worker process is SIGKILLed (the OOM killer) ended with
    BrokenProcessPool's traceback. Now: one line, exit 1, no run left RUNNING, and the same command finishes."""
    import optuna

    from tests.bench import fake_trainer
    from tests.bench.test_signals import command_in

    uri = fresh_store(tmp_path)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    argv = ["tune", "--algo", "grpo", "--trials", "2", "--steps", "30", "--seeds", "0", "--study", "st",
            "--storage", storage, "--tracking-uri", uri, "--experiment", "tx", "--eval-every", "15",
            "--samples-every", "0", "--sampler-seed", "0", "--checkpoint-every", "1", "--workers", "2"]
    runs = tmp_path / ".pobench" / "runs"
    proc = Proc([*FAKE_CLI, *argv], tmp_path, FAKE_STEP_S="0.5")
    try:
        proc.wait_for(lambda: len(checkpointed(runs)) == 2, "a checkpoint of both trials")
        os.kill(_pool_workers(proc.p.pid)[0], signal.SIGKILL)
        rc = proc.finish(timeout=300)
        lines = proc.lines()
        assert rc == 1 and len(lines) == 1 and "Traceback" not in "\n".join(proc.err), proc.text()
        assert lines[0].startswith("bench tune: stopped: a worker process of study 'st' died"), lines
        assert "rerun the same command" in lines[0]
        assert "RUNNING" not in statuses(uri, "tx"), statuses(uri, "tx")
        assert proc.group_gone(within=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.p.pid, signal.SIGKILL)
    fake_trainer.inject(monkeypatch.setattr)  # the same command, in this process
    rc, _, err = bench_here(command_in("x: bench " + " ".join(argv), []), tmp_path)
    assert rc == 0, err[-3000:]
    states = [t.state.name for t in optuna.load_study(study_name="st", storage=storage).trials]
    assert states.count("COMPLETE") >= 2, states
    assert statuses(uri, "tx", "tune-study") == ["FINISHED"]


@pytest.mark.parametrize("study", ["  ", "s" * 513])
def test_a_study_name_that_cannot_be_stored_is_refused_before_the_study(tmp_path, bench_here, study):
    """Held-out round 3: `bench tune --study "  "` ran the study (a trial, three MLflow runs, the Optuna study
    written) and was refused only when writing its outputs."""
    rc, _, err = bench_here(["tune", "--algo", "grpo", "--trials", "1", "--steps", "2", "--study", study], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "--study" in err, err[-3000:]
    assert list(tmp_path.iterdir()) == []


def test_a_stop_after_the_study_is_complete_says_the_study_is_kept(tmp_path, bench_here, monkeypatch):
    """Held-out round 4: a SIGTERM while `bench tune` wrote the outputs of its complete study said "kept nothing".
    The stop is raised where the signal lands (the leaderboard, printed after the outputs are written)."""
    from bench.cli import tune as tune_cmd
    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)

    def signal_lands(study):
        raise KeyboardInterrupt

    monkeypatch.setattr(tune_cmd, "print_leaderboard", signal_lands)
    uri = fresh_store(tmp_path)
    argv = ["tune", "--algo", "grpo", "--trials", "2", "--steps", "2", "--seeds", "0", "--study", "st",
            "--storage", f"sqlite:///{tmp_path}/optuna.db", "--tracking-uri", uri, "--experiment", "tx",
            "--eval-every", "1", "--samples-every", "0", "--sampler-seed", "0", "--workers", "1"]
    rc, _, err = bench_here(argv, tmp_path)
    lines = _lines(err)
    assert rc in (130, 143) and len(lines) == 1, err[-3000:]
    assert "kept the study 'st' with its 2 trials, complete, in sqlite:///" in lines[0], lines
    assert "resume by rerunning the same command" in lines[0] and "kept nothing" not in lines[0]


def test_tune_show_without_a_storage_creates_none(tmp_path, bench_here):
    """Held-out round 4 (a note): `bench tune --show --study nope` in an empty folder left an empty Optuna storage."""
    rc, _, err = bench_here(["tune", "--algo", "grpo", "--show", "--study", "nope"], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "no Optuna storage at" in err, err[-3000:]
    assert list(tmp_path.iterdir()) == []


def _tune_argv(tmp_path, uri: str, *extra: str) -> list[str]:
    return ["tune", "--algo", "grpo", "--trials", "1", "--steps", "2", "--seeds", "0", "--storage",
            f"sqlite:///{tmp_path}/optuna.db", "--tracking-uri", uri, "--experiment", "tx", "--eval-every", "1",
            "--samples-every", "0", "--sampler-seed", "0", "--workers", "1", *extra]


def test_a_tune_metric_the_evaluation_does_not_report_is_refused_before_any_study(tmp_path, bench_here,
                                                                                   monkeypatch):
    """Held-out round 8: `bench tune --metric eval/nonexistent` trained trial 0, printed Optuna's traceback, left the
    study's MLflow run RUNNING and stored the study with the bad metric, so the corrected command was refused. The
    keys the held-out evaluation reports are known from the config: one line, exit 2, no study and no run; the
    corrected command then runs under the default study name."""
    import optuna

    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    uri = fresh_store(tmp_path)
    rc, _, err = bench_here(_tune_argv(tmp_path, uri, "--metric", "eval/nonexistent"), tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "--metric eval/nonexistent" in lines[0] and "eval/accuracy" in lines[0], lines
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / ".pobench").exists()
    assert not _has_experiment(uri, "tx") or statuses(uri, "tx") == []
    rc, _, err = bench_here(_tune_argv(tmp_path, uri), tmp_path)  # the corrected command
    assert rc == 0, err[-3000:]
    assert [t.state.name for t in optuna.load_study(study_name="tune-grpo",
                                                    storage=f"sqlite:///{tmp_path}/optuna.db").trials] == ["COMPLETE"]
    assert statuses(uri, "tx", "tune-study") == ["FINISHED"]


def _has_experiment(uri: str, name: str) -> bool:
    from mlflow import MlflowClient

    return MlflowClient(uri).get_experiment_by_name(name) is not None


def test_an_error_inside_a_trial_ends_the_studys_run(tmp_path, bench_here, monkeypatch):
    """Held-out round 8: an error raised inside a trial (there: the metric missing from the evaluation) left the
    study's MLflow run RUNNING for good. Now the study's run ends FAILED with the error's cause, and no run is left
    RUNNING. (The fake trainer reports eval/accuracy alone: eval/arith/greedy_acc, which the real evaluation reports,
    is missing inside the trial.)"""
    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    uri = fresh_store(tmp_path)
    rc, _, err = bench_here(_tune_argv(tmp_path, uri, "--metric", "eval/arith/greedy_acc"), tmp_path)
    assert rc == 2 and "reports no 'eval/arith/greedy_acc'" in err, err[-3000:]
    assert "RUNNING" not in statuses(uri, "tx"), statuses(uri, "tx")
    assert statuses(uri, "tx", "tune-study") == ["FAILED"]


def test_a_trial_whose_end_the_lost_storage_did_not_write_is_failed_and_queued_again_by_the_rerun(
        tmp_path, bench_here, monkeypatch):
    """Held-out round 9 (H29): the PostgreSQL server restarted (`pg_ctl restart -m fast`) while trial 1 trained:
    the command stopped in one line (exit 1), but the trial's end could not be written, and its lock file was
    already removed as its code ended; the same command then took the trial (RUNNING, no lock file) for one another
    host runs: exit 0 with trial 1 RUNNING for good. Now the lock file stays until the trial's end is in the storage:
    the rerun fails the trial and queues its parameters again. And the rerun's next new trial repeated trial 0's
    parameters (its seeded sampler started over). (The storage's loss is injected here, on SQLite, as the server's
    was: every call to the storage fails from trial 1's first report on, until "the server is back".)"""
    import sqlalchemy.exc
    from optuna.storages import RDBStorage

    from bench.tune.study import resumed_seed

    fake_trainer.inject(monkeypatch.setattr)
    gone = {"now": False}

    def lost(real):
        def call(self, *args, **kwargs):
            if real.__name__ == "set_trial_intermediate_value" and self.get_trial_number_from_id(args[0]) == 1:
                gone["now"] = True
            if gone["now"]:
                raise sqlalchemy.exc.OperationalError("SELECT 1", None, Exception("server closed the connection"))
            return real(self, *args, **kwargs)
        return call

    for name in ("set_trial_intermediate_value", "set_trial_state_values", "get_trial", "get_all_trials",
                 "set_trial_user_attr", "create_new_trial"):
        monkeypatch.setattr(RDBStorage, name, lost(getattr(RDBStorage, name)))
    uri = fresh_store(tmp_path)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    argv = _argv(tmp_path, storage, uri, steps=2, trials=3)
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 1 and len(_lines(err)) == 1 and "the Optuna storage" in err, err[-3000:]
    gone["now"] = False  # the server is back: the same command
    monkeypatch.undo()
    fake_trainer.inject(monkeypatch.setattr)
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    trials = optuna.load_study(study_name="st", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"], trials
    assert trials[2].params == trials[1].params  # queued again with its parameters
    # the seeded sampler of the resumed study does not start over (it proposed trial 0's parameters again): seeded
    # from (seed, trials in the study); a fresh study keeps its seed, its trials as before (trial 0 here)
    assert trials[0].params == FRESH_SEED_0_TRIAL_0, trials[0].params
    assert trials[3].params != trials[0].params
    assert resumed_seed(0, 0) == 0 and resumed_seed(None, 3) is None and resumed_seed(0, 1) != resumed_seed(0, 2)
    assert "RUNNING" not in statuses(uri, "tx"), statuses(uri, "tx")
    assert not list((tmp_path / ".pobench" / ".locks").glob("tune-*"))  # (no lock file left behind)



#: trial 0 of a fresh study of `_argv` (grpo's space, --sampler-seed 0), as sampled before and after round 9
FRESH_SEED_0_TRIAL_0 = {"clip_high": 0.2609671816250754, "clip_low": 0.30031627823034684,
                        "kl_coef": 0.012520653814999465}
