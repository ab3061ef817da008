"""Held-out round 16's lines whose advice the command could not follow (/work/r16-report.md: H21, H19):

- H21: `bench run` again with another ``--tracking-uri`` in the folder of a comparison made in ``mlflow.db``: each
  pair failed (its line printed twice) after the comparison run was made in the new store, telling the user to "drop
  --resume (and give another --run-name)", flags `bench run` has not. Now one line before any work (exit 2, no
  comparison made in the new store) with the ways `bench run` has: the store's own --tracking-uri, another
  --output-dir, --force;
- H19: `bench tune` stopped by a full disk said `bench train`'s "then resume ... the resume starts at step 0, in the
  same MLflow run"; `bench tune` has no resume, its rerun goes on with the study.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

from tests import launch
from tests.conftest import fresh_store

RUN = ["run", "--algos", "grpo,dapo", "--seeds", "0", "--no-controls", "--workers", "1", "--steps", "1",
       "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--eval-every", "0", "--no-report",
       "--no-progress"]


def _bench(argv: list[str], cwd: Path, timeout: float = 300):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return launch.run([sys.executable, "-m", "bench.cli", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                      timeout=timeout)


def test_a_comparison_again_in_another_store_is_refused_before_any_work_with_bench_runs_own_ways_on(
        tmp_path, bench_here):
    """H21: the comparison made in mlflow.db, then the same command with --tracking-uri sqlite:///other.db."""
    old = fresh_store(tmp_path)  # (the default store of the folder: mlflow.db)
    rc, _, err = bench_here(RUN, tmp_path)
    assert rc == 0, err[-3000:]
    fresh_store(tmp_path, "other.db")
    p = _bench([*RUN, "--tracking-uri", "sqlite:///other.db"], tmp_path)
    assert p.returncode == 2, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and " INFO " not in ln]
    assert len(lines) == 1 and lines[0].startswith("bench run: error: "), p.stderr[-3000:]
    line = lines[0]
    assert "and 1 more pair folder(s) hold these pairs' runs of another MLflow store" in line, line
    assert f"rerun with --tracking-uri sqlite:///{tmp_path}/mlflow.db" in line and "--output-dir" in line, line
    assert "--force" in line and "--resume" not in line and "--run-name" not in line, line
    with sqlite3.connect(tmp_path / "other.db") as db:  # nothing made in the new store
        assert db.execute("select count(*) from runs").fetchone() == (0,)
        assert db.execute("select count(*) from experiments where name = 'pobench'").fetchone() == (0,)
    # the first way on works: the store's own --tracking-uri reuses the pairs
    rc, out, err = bench_here([*RUN, "--tracking-uri", old], tmp_path)
    assert rc == 0 and out.count("seed 0: reused") == 2, out + err[-3000:]


def _disk_full_at_checkpoints(monkeypatch) -> None:
    """Every checkpoint write meets a full disk (ENOSPC from the write of its state file), until the test ends."""
    import errno

    from bench.runs import checkpoint

    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(checkpoint, "_write_text", full)


def test_a_full_disk_stopping_bench_tune_says_what_its_rerun_does_not_bench_trains_resume(tmp_path, bench_here,
                                                                                           monkeypatch):
    """H19: `bench tune` whose trial's checkpoint met a full disk said "then resume; no checkpoint was written yet (the
    resume starts at step 0, in the same MLflow run)": `bench tune` has no resume, and its rerun makes a new trial.
    Now the line says to rerun the same command, that the study goes on with a new trial, what is kept; and the
    rerun (space freed) does that."""
    import optuna

    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    uri, storage = fresh_store(tmp_path), f"sqlite:///{tmp_path}/optuna.db"
    argv = ["tune", "--algo", "grpo", "--trials", "2", "--steps", "2", "--seeds", "0", "--study", "fs", "--storage",
            storage, "--tracking-uri", uri, "--eval-every", "1", "--samples-every", "0", "--sampler-seed", "0",
            "--workers", "1"]
    with monkeypatch.context() as m:
        _disk_full_at_checkpoints(m)
        rc, _, err = bench_here(argv, tmp_path)
    lines = [ln for ln in err.splitlines() if ln.startswith("bench tune: ")]
    assert rc == 1 and len(lines) == 1, err[-3000:]
    line = lines[0]
    assert line.startswith("bench tune: stopped: no space left on device while writing ") and "fs-t0-s0" in line, line
    assert ": free space (or raise the file-size limit), then rerun the same command: the study goes on with a new " \
           "trial" in line, line
    assert "kept: 0 of 2 trials finished of study 'fs' in " in line and "ended FAILED" in line, line
    assert "resume" not in line, line  # (bench tune has no resume: its rerun goes on with the study)
    rc, _, err = bench_here(argv, tmp_path)  # space freed: the rerun does what the line said
    assert rc == 0, err[-3000:]
    trials = optuna.load_study(study_name="fs", storage=storage).trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE"], trials


def test_a_full_disk_stopping_a_pair_of_bench_run_still_says_rerun_the_same_command(tmp_path, bench_here,
                                                                                     monkeypatch):
    """H19's check of `bench run`: its pair's line for the same fault says to rerun the same command (round 15)."""
    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    fresh_store(tmp_path)
    _disk_full_at_checkpoints(monkeypatch)
    rc, out, err = bench_here([*RUN, "--algos", "grpo"], tmp_path)
    failed = [ln for ln in (out + err).splitlines() if "grpo" in ln and ": failed: " in ln]
    assert rc == 1 and failed, out + err[-3000:]
    assert all("no space left on device while writing " in ln and "then rerun the same command" in ln
               for ln in failed), failed


def test_a_pair_whose_resume_is_refused_during_the_comparison_says_bench_runs_ways_on_too(tmp_path):
    """H21, the pair's own line (its folder written by another command after the check before the comparison): the
    same ways on, not "drop --resume (and give another --run-name)"."""
    from dataclasses import replace

    from bench.comparison.pairs import _resume_refused
    from bench.comparison.plan import new_pair, pair_config, run_dir
    from bench.config import TrainConfig
    from bench.runs import resume

    cfg = TrainConfig.from_dict({"output_dir": str(tmp_path), "tracking_uri": "sqlite:///a.db"})
    p = new_pair("grpo", 0, {}, "0" * 12)
    folder = run_dir(cfg, p)
    folder.mkdir(parents=True)
    pair_config(cfg, p, "c1", None).save(folder / "config.yaml")
    new = replace(cfg, tracking_uri="sqlite:///b.db")
    try:
        resume.check(pair_config(new, p, "c1", None), folder)
    except ValueError as e:
        said = _resume_refused(new, p, "c1", e)
    assert said.startswith(f"{folder} holds this pair's run of another MLflow store (sqlite:///a.db; this command's "
                           "is sqlite:///b.db): rerun with --tracking-uri sqlite:///a.db to resume it there"), said
    assert "--output-dir" in said and "--force" in said and "--resume" not in said and "--run-name" not in said
