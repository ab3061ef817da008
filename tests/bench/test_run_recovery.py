"""Runs that a killed process, a deleted folder or a run deleted in MLflow left behind, as a user meets them (held-out
rounds 5 and 8 of issue 29; real processes, a real SQLite store): the next command ends what a dead process left
RUNNING (never a live process's run), retrains what is gone, and never replaces a complete report by a partial one.
"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from reports.paths import MARKER
from tests.bench.test_held_out_faults import TINY
from tests.bench.test_signals import FAKE_CLI, Proc, checkpointed, statuses
from tests.conftest import fresh_store


def test_a_run_folder_deleted_while_training_fails_the_run_in_one_line_and_the_rerun_trains_it(tmp_path, bench_here):
    """Held-out round 5: `.pobench` deleted while `bench train` trained: the loop recreated `ckpt-*` and `final` in
    a folder without the marker, `run.json` or `config.yaml`; the plain rerun then said "pass --resume" and
    `--resume` said "not a pobench run folder": a dead end. Now the next checkpoint is refused in one line (the run
    ends FAILED), nothing is recreated, and the same command trains the run again; a folder left without its marker
    gets the same line from the rerun and from --resume. Held-out round 16 (H17): that line was exit 2 ("bad input
    before any work") and said to "move what is left of it away" of a folder gone: now exit 1 and only the rerun."""
    import shutil
    import sys

    uri = fresh_store(tmp_path)
    def argv(steps: int) -> list[str]:
        return ["train", "--run-name", "r", "--tracking-uri", uri, "--steps", str(steps), *TINY[2:]]

    p = Proc([sys.executable, "-m", "bench.cli", *argv(400)], tmp_path)
    p.wait_for(lambda: checkpointed(tmp_path / ".pobench" / "runs" / "pobench"), "a checkpoint")
    shutil.rmtree(tmp_path / ".pobench")
    assert p.finish() == 1, p.text()  # (held-out round 16, H17: a fault during the work, was 2: "bad input")
    assert not (tmp_path / ".pobench").exists(), sorted(map(str, (tmp_path / ".pobench").rglob("*")))
    lines = [ln for ln in p.lines() if not ln.startswith("bench: warning")]
    assert lines == ["bench train: error: the run folder .pobench/runs/pobench/r was deleted while the run trained: "
                     "nothing more is written; rerun the command to train the run again from step 0"], lines
    assert statuses(uri, "pobench") == ["FAILED"]
    run = tmp_path / ".pobench" / "runs" / "pobench" / "r"  # its marker alone gone: one line, --resume or not
    rc, out, err = bench_here(argv(2), tmp_path)
    assert rc == 0 and statuses(uri, "pobench") == ["FAILED", "FINISHED"], err[-3000:]
    (run / MARKER).unlink()
    for extra in ([], ["--resume"]):
        rc, out, err = bench_here([*argv(2), *extra], tmp_path)
        assert rc == 2 and "is not a pobench run folder" in err and "move it away" in err, err[-3000:]


@pytest.mark.slow
def test_a_killed_bench_runs_runs_are_ended_by_a_rerun_with_other_flags_never_a_live_ones(tmp_path, bench_here,
                                                                                         monkeypatch):
    """Held-out round 8: a SIGKILLed `bench run`, then a rerun with one flag changed: its comparison run and its
    pair's run stayed RUNNING for good (only the same command, whose pair folder and comparison id are the same,
    ended them). Now any `bench run` into that experiment's folder ends them (the pair's run KILLED, it had a
    checkpoint; the comparison run KILLED) once their process is gone, and never while it lives: a `bench run` with
    other flags beside the live one leaves its runs RUNNING."""
    from tests.bench import fake_trainer

    (tmp_path / "long.yaml").write_text("steps: 40\neval_every: 0\ncheckpoint_every: 1\nsamples_every: 0\n")
    uri = fresh_store(tmp_path)
    folder = tmp_path / ".pobench" / "runs" / "pobench"
    argv = ["run", "--config", "long.yaml", "--algos", "grpo", "--seeds", "0", "--workers", "1", "--no-report",
            "--no-progress"]
    proc = Proc([*FAKE_CLI, *argv], tmp_path, FAKE_STEP_S="0.5")
    fake_trainer.inject(monkeypatch.setattr)
    try:
        proc.wait_for(lambda: len(checkpointed(folder)) == 1, "a checkpoint of the pair")
        rc, _, err = bench_here([*argv, "--steps", "2", "--lr", "1e-4"], tmp_path, FAKE_STEP_S="0")  # it lives
        assert rc == 0, err[-3000:]
        assert statuses(uri, "pobench").count("RUNNING") == 2, statuses(uri, "pobench")  # its runs left alone
        assert proc.p.poll() is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.p.pid, signal.SIGKILL)
        proc.finish(timeout=60)
    assert statuses(uri, "pobench").count("RUNNING") == 2  # what the kill left
    rc, _, err = bench_here([*argv, "--steps", "2", "--lr", "2e-4"], tmp_path, FAKE_STEP_S="0")  # another flag
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    assert "RUNNING" not in statuses(uri, "pobench"), statuses(uri, "pobench")
    assert statuses(uri, "pobench", "comparison") == ["FINISHED", "FINISHED", "KILLED"]
    assert statuses(uri, "pobench", "train") == ["FINISHED", "FINISHED", "KILLED"]
    assert not list((folder / ".locks").glob("*.live.lock"))


def test_a_pair_run_deleted_in_mlflow_is_trained_again_and_a_complete_report_is_never_replaced_by_a_partial(
        tmp_path, bench_here, monkeypatch):
    """Held-out round 8: a pair's run deleted in MLflow (to redo it), then the same `bench run`: MLflow's "must be in
    the 'active' state" traceback (the deleted run was resumed from its folder's checkpoints), the pair failed, the
    FINISHED comparison run became FAILED and the complete report was replaced by one holding the other objective
    alone. Now a deleted pair run is absent: the pair is trained again, saying so; and while a pair fails, the earlier
    report of the comparison is kept, in one line."""
    from mlflow import MlflowClient

    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    uri = fresh_store(tmp_path)
    argv = ["run", "--algos", "grpo,dapo", "--seeds", "0", "--no-controls", "--steps", "2", "--eval-every", "1",
            "--checkpoint-every", "1", "--samples-every", "0", "--workers", "1", "--no-progress"]
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    (report,) = (tmp_path / "reports" / "out" / "pobench").glob("*/report.md")
    complete = report.read_text()
    assert "dapo" in complete and "grpo" in complete
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("pobench").experiment_id
    (grpo,) = client.search_runs([exp], "tags.`pobench.kind` = 'train' and tags.`pobench.objective` = 'grpo'")
    assert checkpointed(tmp_path / ".pobench" / "runs" / "pobench")  # (what the rerun resumed from)
    client.delete_run(grpo.info.run_id)

    real = fake_trainer.fake_train

    def grpo_fails(cfg, **kw):
        if cfg.algo == "grpo":
            raise ValueError("the retraining fails too")
        return real(cfg, **kw)

    monkeypatch.setattr(fake_trainer, "fake_train", grpo_fails)
    rc, out, err = bench_here(argv, tmp_path)
    assert rc == 1 and "Traceback" not in out + err and "active' state" not in out + err, (out + err)[-3000:]
    assert f"its MLflow run {grpo.info.run_id} was deleted in the store; trained again" in out + err
    assert f"the earlier report {report} is kept: 1 pair(s) failed" in err, err[-3000:]
    assert report.read_text() == complete  # not replaced by dapo's alone

    monkeypatch.setattr(fake_trainer, "fake_train", real)
    rc, out, err = bench_here(argv, tmp_path)
    assert rc == 0 and "Traceback" not in out + err, (out + err)[-3000:]
    assert "dapo" in report.read_text() and "grpo" in report.read_text()
    assert "RUNNING" not in statuses(uri, "pobench"), statuses(uri, "pobench")
    assert "FINISHED" in statuses(uri, "pobench", "comparison")
    (new,) = client.search_runs([exp], "tags.`pobench.kind` = 'train' and tags.`pobench.objective` = 'grpo'")
    assert new.info.status == "FINISHED" and new.info.run_id != grpo.info.run_id


@pytest.mark.slow
def test_a_killed_pairs_run_is_ended_by_a_bench_train_into_the_same_experiment(tmp_path, bench_here, monkeypatch):
    """Held-out round 8 (the same fault, met by `bench train`): the run a SIGKILLed `bench run`'s pair left RUNNING
    stayed RUNNING whatever trained next in the experiment's folder. A `bench train` there ends it (KILLED: it has a
    checkpoint)."""
    from bench.engines import entry as engines
    from tests.bench import fake_trainer

    (tmp_path / "long.yaml").write_text("steps: 40\neval_every: 0\ncheckpoint_every: 1\nsamples_every: 0\n")
    uri = fresh_store(tmp_path)
    folder = tmp_path / ".pobench" / "runs" / "pobench"
    proc = Proc([*FAKE_CLI, "run", "--config", "long.yaml", "--algos", "grpo", "--seeds", "0", "--workers", "1",
                 "--no-report", "--no-progress"], tmp_path, FAKE_STEP_S="0.5")
    try:
        proc.wait_for(lambda: len(checkpointed(folder)) == 1, "a checkpoint of the pair")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.p.pid, signal.SIGKILL)
        proc.finish(timeout=60)
    assert statuses(uri, "pobench", "train") == ["RUNNING"]
    monkeypatch.setattr(engines, "train", fake_trainer.fake_train)
    rc, _, err = bench_here(["train", "--algo", "dapo", "--steps", "2", "--eval-every", "0", "--samples-every", "0",
                             "--no-progress"], tmp_path, FAKE_STEP_S="0")
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    assert "left RUNNING by a killed process" in err
    assert statuses(uri, "pobench", "train") == ["FINISHED", "KILLED"], statuses(uri, "pobench", "train")
