"""Held-out round 14, stores and signals: the MLflow server lost during `bench eval --comparison` (H21), SIGHUP (a
closed terminal) handled as SIGTERM (H08), the MLflow store damaged during `bench train` (H10), the Optuna SQLite
storage damaged mid-study (H14): each one line saying what is kept and a way out that works, with its exit code."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

TINY = ["--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--samples-every", "0",
        "--no-progress"]


def statuses(db: Path) -> list[tuple[str, str]]:
    """(name, status) of every run in the store file ``db``."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return list(con.execute("select name, status from runs"))
    finally:
        con.close()


# ------------------------------------------------------------------ H21: the server lost during eval --comparison
def test_h21_a_server_lost_during_eval_comparison_stops_within_the_bound_and_the_rerun_ends_its_run(
        tmp_path, bench_here, monkeypatch):
    """Held-out round 14 (H21): the real `mlflow server` SIGKILLed (with its workers) during `bench eval --comparison`:
    nothing printed and no exit for 136 s (MLflow's own retries of each request), until an outside SIGTERM. Now its
    requests are bounded as `bench report`'s and `bench run`'s: one `stopped:` line naming the server, the
    evaluations stored (the rerun reuses them) and the results of the one being stored, exit 1, within seconds; with
    the server back the same command ends the eval run the lost server left RUNNING and stores the rest."""
    from bench import evaluate
    from tests.conftest import MlflowServer

    if shutil.which("mlflow") is None:
        pytest.skip("the `mlflow` command is not on PATH")
    server = MlflowServer(tmp_path / "srv")
    (tmp_path / "srv").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    server.start()
    try:
        rc, _, err = bench_here(["run", "--algos", "grpo,dapo", "--seeds", "0", "--steps", "1", "--max-new-tokens",
                                 "8", "--eval-every", "1", "--workers", "1", "--no-report", "--no-controls", *TINY],
                                work, MLFLOW_TRACKING_URI=server.uri)
        assert rc == 0, err[-3000:]
        from mlflow import MlflowClient

        client = MlflowClient(server.uri)
        exp_id = client.get_experiment_by_name("pobench").experiment_id
        (cid,) = {r.data.tags["pobench.comparison"] for r in client.search_runs([exp_id])
                  if "pobench.comparison" in r.data.tags}
        real_log_batch, killed = evaluate.log_batch, []

        def kill_at_the_second(*args, **kwargs):  # the second eval run made, its numbers not yet sent
            if len(killed) == 0 and kill_at_the_second.calls == 1:
                server.kill()
                killed.append(time.monotonic())
            kill_at_the_second.calls += 1
            return real_log_batch(*args, **kwargs)

        kill_at_the_second.calls = 0
        monkeypatch.setattr(evaluate, "log_batch", kill_at_the_second)
        cmd = ["eval", "--comparison", cid, "--benchmarks", "arith", "--limit", "4", "--max-new-tokens", "8"]
        rc, _, err = bench_here(cmd, work, MLFLOW_TRACKING_URI=server.uri, POBENCH_MLFLOW_TIMEOUT="1")
        seconds = time.monotonic() - killed[0]
        last = err.strip().splitlines()[-1]
        assert rc == 1 and last.startswith(f"bench eval: stopped: MLflow tracking server {server.uri} stopped "
                                           "answering"), err[-3000:]
        assert f"kept: 1 of 2 evaluations of comparison {cid} stored" in last and "results.json" in last, last
        assert last.endswith("once it answers again, rerun the same command") and "Traceback" not in err, last
        assert seconds < 20, seconds
        assert [s for _, s in statuses(tmp_path / "srv" / "mlflow.db")].count("RUNNING") == 1  # (the lost one's)

        monkeypatch.setattr(evaluate, "log_batch", real_log_batch)
        server.start()
        rc, _, err = bench_here(cmd, work, MLFLOW_TRACKING_URI=server.uri)
        assert rc == 0 and "1 stored, 1 to evaluate" in err and "was ended FAILED" in err, err[-3000:]
    finally:
        server.stop()
    runs = statuses(tmp_path / "srv" / "mlflow.db")
    assert "RUNNING" not in {s for _, s in runs}, runs
    assert sorted(s for n, s in runs if n.startswith("eval-")) == ["FAILED", "FINISHED", "FINISHED"], runs


# ------------------------------------------------------------------ H08: SIGHUP, a closed terminal
def test_h08_sighup_to_bench_train_stops_it_as_sigterm_does(tmp_path, bench_here):
    """Held-out round 14 (H08): SIGHUP (the terminal closed, an ssh connection dropped) to `bench train`: exit 129,
    nothing printed, the run left RUNNING (the next command ended it KILLED and refused to go on without --resume).
    Now the same path as SIGTERM: `stopped by SIGHUP; kept <checkpoint> (step N); resume with: ... --resume`, exit
    129, the run KILLED, and the printed command finishes it."""
    from tests.bench.test_signals import BENCH, Proc, command_in, stopped_line
    from tests.conftest import fresh_store

    uri = fresh_store(tmp_path)
    run_dir = tmp_path / ".pobench" / "runs" / "pobench" / "h"
    proc = Proc([*BENCH, "train", "--steps", "8", "--eval-every", "0", "--checkpoint-every", "1", *TINY,
                 "--max-new-tokens", "8", "--run-name", "h"], tmp_path)
    proc.wait_for(lambda: (run_dir / "ckpt-0000001" / "state.json").exists(), "first checkpoint")
    os.kill(proc.p.pid, signal.SIGHUP)
    line = stopped_line(proc, proc.finish(), signal.SIGHUP)
    kept = sorted(run_dir.glob("ckpt-*"))[-1]
    assert f"kept {kept.relative_to(tmp_path)} (step {int(kept.name.split('-')[1])}); resume with: bench train " \
           in line and line.endswith(" --resume"), line
    assert [s for _, s in statuses(tmp_path / "mlflow.db")] == ["KILLED"]
    rc, _, err = bench_here(command_in(line, []), tmp_path)  # (the printed command)
    assert rc == 0, err[-3000:]
    assert [s for _, s in statuses(tmp_path / "mlflow.db")] == ["FINISHED"], uri


def test_h08_sighup_while_the_store_is_created_leaves_a_whole_store_and_one_line(tmp_path):
    """H08 (a): SIGHUP while `bench train` created the fresh store of a new folder: exit 129, nothing printed, a
    0-byte ``mlflow.db`` and the half-made ``.mlflow.db.pobench-creating`` left. Now the store's creation ends whole
    (a store call is not cut by a stop signal), then the one line and 129; nothing half-made is left."""
    from tests.bench.test_signals import BENCH, Proc, stopped_line

    creating = tmp_path / ".mlflow.db.pobench-creating"
    # (a new interpreter: its first store is made by MLflow's migrations, seconds, where the signal lands)
    proc = Proc([*BENCH, "train", "--steps", "2", *TINY, "--run-name", "h"], tmp_path, fresh=True)
    proc.wait_for(creating.exists, "the store being created", timeout=300)
    os.kill(proc.p.pid, signal.SIGHUP)
    line = stopped_line(proc, proc.finish(), signal.SIGHUP)
    assert "rerun: bench train " in line, line
    assert not list(tmp_path.glob(".mlflow.db.pobench-creating*")), sorted(p.name for p in tmp_path.iterdir())
    db = tmp_path / "mlflow.db"
    if db.exists():  # (whole: MLflow's schema revision in it)
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            assert con.execute("select version_num from alembic_version").fetchall(), "a store without its revision"
        finally:
            con.close()
    assert "RUNNING" not in {s for _, s in (statuses(db) if db.exists() else [])}


def test_h08_sighup_to_the_group_of_bench_run_ends_its_pool_and_kills_the_pairs(tmp_path):
    """H08 in a pool: a closed terminal's SIGHUP reaches the whole foreground group (the command and its pool
    workers). The workers' pairs checkpoint and end KILLED as on SIGTERM (they died by the signal: a broken pool,
    runs RUNNING), the command says what is kept and exits 129; no process is left."""
    from tests.bench.test_signals import FAKE_CLI, Proc, checkpointed, stopped_line
    from tests.conftest import fresh_store

    (tmp_path / "long.yaml").write_text("steps: 40\neval_every: 0\ncheckpoint_every: 1\nsamples_every: 0\n")
    fresh_store(tmp_path)
    folder = tmp_path / ".pobench" / "runs" / "pobench"
    proc = Proc([*FAKE_CLI, "run", "--config", "long.yaml", "--algos", "grpo,tepo", "--seeds", "0", "--workers", "2",
                 "--no-report", "--no-progress"], tmp_path, FAKE_STEP_S="0.5")
    proc.wait_for(lambda: len(checkpointed(folder)) == 2, "a checkpoint of both pairs")
    os.killpg(proc.p.pid, signal.SIGHUP)
    line = stopped_line(proc, proc.finish(timeout=300), signal.SIGHUP)
    assert proc.group_gone(), "processes of the stopped `bench run` are still alive"
    assert "kept 0 of 2 pairs finished and 2 checkpointed of comparison " in line and \
        "resume by rerunning the same command: bench run " in line, line
    assert sorted(s for _, s in statuses(tmp_path / "mlflow.db")) == ["KILLED", "KILLED", "KILLED"]


# ------------------------------------------------------------------ H10: the MLflow store damaged during bench train
def test_h10_a_store_damaged_during_bench_train_says_what_is_kept_and_ways_on_that_work(tmp_path, bench_here,
                                                                                        monkeypatch):
    """Held-out round 14 (H10): ``mlflow.db`` cut to 8192 bytes during `bench train --checkpoint-every 2`: "is
    damaged (...); restore it from a backup, or move it away and rerun", nothing of the checkpoints; moved away, the
    rerun was refused (pass --resume), and with --resume advised `--force`, which `bench train` has not: a dead end.
    Now the line names the checkpoint kept and both ways on; each command it prints works: the one that trains the
    run again in a new store (after moving the store and the run folder away) finishes; the refusal of --resume
    against a store without the run names only what `bench train` has."""
    from bench.runs import checkpoint
    from tests.conftest import fresh_store

    fresh_store(tmp_path)
    db = tmp_path / "mlflow.db"
    real_save = checkpoint.save

    def save_then_damage(folder, step, **parts):  # (a bad copy, a disk error: the file cut once a checkpoint is kept)
        out = real_save(folder, step, **parts)
        if step == 2:
            os.truncate(db, 8192)
        return out

    monkeypatch.setattr(checkpoint, "save", save_then_damage)
    cmd = ["train", "--steps", "4", "--eval-every", "0", "--checkpoint-every", "2", *TINY, "--max-new-tokens", "8",
           "--run-name", "t"]
    monkeypatch.setattr(sys, "argv", ["bench", *cmd])  # (the command the line prints is this process's)
    rc, _, err = bench_here(cmd, tmp_path)
    monkeypatch.setattr(checkpoint, "save", real_save)
    last = err.strip().splitlines()[-1]
    run_dir = Path(".pobench") / "runs" / "pobench" / "t"
    assert rc == 1 and last.startswith(f"bench train: stopped: the MLflow store sqlite:///{db} is damaged ("), err
    assert " is damaged ((sqlite3.DatabaseError) database disk image is malformed); " in last, last  # (not SQLAlchemy's
    # autoflush note, which came first in the error's text)
    assert f"kept: the checkpoint of step 2 in {run_dir / 'ckpt-0000002'}" in last, last
    assert "move it away and rerun" not in last and "--force" not in last, last
    assert f"restore the store from a backup, then resume with: bench train {' '.join(cmd[1:])} --resume" in last
    fresh = f"move {db} and {run_dir} away, then run: bench train {' '.join(cmd[1:])}"
    assert last.endswith(fresh), last

    # the store moved away only: --resume is refused naming what `bench train` has (no --force), exit 2 (the later
    # commands each in a process of its own, as the user's: this one keeps MLflow's engine on the damaged file open)
    from tests import launch
    from tests.bench.test_signals import BENCH, env

    db.rename(tmp_path / "damaged.db")
    done = launch.run([*BENCH, *cmd, "--resume"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env())
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "which the store" in last and "--force" not in last, done.stderr[-3000:]
    assert last.endswith(f"move {run_dir} away, then rerun: bench train {' '.join(cmd[1:])}"), last
    # the way on the stop line printed: the run folder moved away too, the printed command trains the run again
    (tmp_path / run_dir).rename(tmp_path / "t-damaged")
    done = launch.run([*BENCH, *cmd], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert [s for _, s in statuses(tmp_path / "mlflow.db")] == ["FINISHED"]


# ------------------------------------------------------------------ H14: the Optuna SQLite storage damaged mid-study
def test_h14_an_optuna_storage_damaged_mid_study_is_said_damaged_not_kept(tmp_path, bench_here, monkeypatch):
    """Held-out round 14 (H14): ``truncate -s 4096 st.db`` while `bench tune` trained a trial: "the Optuna storage
    ... failed (DatabaseError: ... malformed); the study stopped, its finished trials are kept in the storage ...;
    once the storage answers again, rerun": both false (nothing is kept there, waiting does not help). Now the
    damaged-storage line (as the round-2 row promises): is damaged (...), restore it or move it away, exit 1, no run
    left RUNNING; the way it names (moved away, the same command under another --study) runs a new study."""
    import dataclasses

    from bench import tune
    from tests.bench import fake_trainer
    from tests.conftest import fresh_store

    fresh_store(tmp_path)
    storage = tmp_path / "st.db"
    real_run_workers = tune.run_workers

    def damaging_train(cfg, **kwargs):  # trial 1 starts training once the storage file is cut (a bad copy)
        if cfg.run_name.startswith("s-t1-"):
            os.truncate(storage, 4096)
        return fake_trainer.fake_train(cfg, **kwargs)

    monkeypatch.setattr(tune, "run_workers", lambda spec, *args, **kwargs: real_run_workers(
        dataclasses.replace(spec, train_fn=damaging_train), *args, **kwargs))
    cmd = ["tune", "--algo", "grpo", "--trials", "2", "--steps", "4", "--eval-every", "2", "--seeds", "0",
           "--workers", "1", "--sampler-seed", "0", "--samples-every", "0", "--storage", "sqlite:///st.db"]
    rc, _, err = bench_here([*cmd, "--study", "s"], tmp_path)
    last = err.strip().splitlines()[-1]
    assert rc == 1 and last.startswith("bench tune: stopped: the Optuna storage sqlite:///st.db is damaged ("), err
    assert "malformed" in last and "restore it from a backup" in last and "move it away" in last, last
    assert "are kept in the storage" not in last and "answers again" not in last and "Traceback" not in err, last
    assert "RUNNING" not in {s for _, s in statuses(tmp_path / "mlflow.db")}, statuses(tmp_path / "mlflow.db")
    # the way on it names: the storage moved away, the same command under another --study runs a new study
    storage.rename(tmp_path / "damaged.db")
    rc, _, err = bench_here([*cmd, "--study", "s2"], tmp_path)
    assert rc == 0, err[-3000:]
