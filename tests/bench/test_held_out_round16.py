"""Held-out rounds 16 and 17 (issue 29): what MLflow prints by itself among pobench's lines (H03: a command says what
it does in its own lines only), a malformed environment variable ignored (H28), faults of the store and the disk in
one line (H31, H32), a user's file where pobench's lock folder goes (round 17, H25)."""

from __future__ import annotations

import os
import sys

import pytest

from tests import launch


def test_a_first_run_with_no_progress_prints_no_mlflow_bar_or_store_creation_lines(tmp_path):
    """H03: `bench run ... --no-progress` (and `bench train`) in a new folder printed MLflow's "Downloading
    artifacts: 100%" bar (the run's own sample files, read back to log them as one table when it finishes) and its
    INFO lines "Creating initial MLflow database tables..." / "Updating database tables" (the store's creation).
    Now neither: stderr holds nothing but pobench's lines; the table and the store are made as before. (Forked from
    the tests' zygote, this command's store is a copy of the one the zygote made: the lines of MLflow's migrations, a
    process's first store, are tested in tests/reports/test_store_template.py.)"""
    proc = launch.run([sys.executable, "-m", "bench", "train", "--steps", "2", "--prompts-per-step", "2",
                       "--group-size", "2", "--eval-problems", "4", "--samples-every", "1", "--no-progress",
                       "--run-name", "quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for noise in ("Downloading artifacts", "Creating initial MLflow database tables", "Updating database tables",
                  "INFO"):
        assert noise not in proc.stderr, proc.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("pobench").experiment_id])[0]
    assert "samples.json" in [a.path for a in client.list_artifacts(run.info.run_id)]


@pytest.mark.parametrize("value, why", [("abc", "give a number of seconds"), ("-5", "give a number of seconds >= 0"),
                                        ("inf", "give a number of seconds >= 0")])
def test_a_malformed_pool_stop_grace_is_refused_before_any_work(bench_here, tmp_path, value, why):
    """Held-out round 16 (H28): `POBENCH_POOL_STOP_GRACE=abc bench run ...` (the README: it "sets that wait") trained
    and stopped with the default 30 s, the value ignored without a word, while a malformed POBENCH_PROGRESS_EVERY or
    POBENCH_MLFLOW_TIMEOUT is refused. Now `bench run` and `bench tune` refuse it in one line before any work (exit
    2, nothing made in the folder)."""
    for argv in (["run", "--algos", "grpo", "--seeds", "0", "--no-controls", "--steps", "1", "--no-report"],
                 ["tune", "--algo", "grpo", "--trials", "1", "--steps", "1"]):
        rc, _, err = bench_here(argv, tmp_path, POBENCH_POOL_STOP_GRACE=value)
        assert rc == 2, err
        assert err.strip() == f"bench {argv[0]}: error: POBENCH_POOL_STOP_GRACE={value!r}: {why}", err
        assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_an_edited_file_of_a_warm_started_model_is_neither_reused_nor_replaced(bench_here, tmp_path):
    """Held-out round 16 (H26): `bench warmstart --out ws`, the user appends a note to `ws/config.json` (now invalid
    JSON) and adds `ws/notes.md`; the same command said "warm-started model: ws" (the damaged model taken as done),
    and with `--force` replaced the edit silently. Now the files a warm start writes are recorded with their digests
    (as `bench report`'s and `bench eval --out`'s since round 15): an edited one is refused in one line before any
    work, with or without --force, the folder as the user left it; moved away, the same command writes it again."""
    argv = ["warmstart", "--steps", "2", "--eval", "0", "--no-progress", "--out", "ws"]
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err
    config = tmp_path / "ws" / "config.json"
    edited = config.read_text() + "# my note\n"
    config.write_text(edited)
    (tmp_path / "ws" / "notes.md").write_text("mine")
    for extra in ([], ["--force"]):
        rc, out, err = bench_here([*argv, *extra], tmp_path)
        assert rc == 2, out + err
        assert err.strip() == ("bench warmstart: error: --out ws: config.json changed since pobench wrote it (your "
                               "edits): not replacing it; move it away (or copy your edits elsewhere), then run the "
                               "same command again"), err
        assert config.read_text() == edited and (tmp_path / "ws" / "notes.md").read_text() == "mine"
    config.rename(tmp_path / "my-config.json")
    rc, out, err = bench_here(argv, tmp_path)
    assert rc == 0 and config.exists() and (tmp_path / "ws" / "notes.md").exists(), err


FREEZE_AT_STEP_2 = """
import subprocess, sys
from bench.runs import checkpoint
real_save = checkpoint.save
def save_then_freeze(folder, step, **parts):  # (the store made unwritable once a checkpoint is kept)
    out = real_save(folder, step, **parts)
    if step == 2:
        subprocess.run(["chattr", "+i", "mlflow.db"], check=True)
    return out
checkpoint.save = save_then_freeze
from bench.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_store_made_unwritable_while_bench_train_trains_is_one_line_with_the_resume(tmp_path):
    """Held-out round 16 (H31): `chattr +i mlflow.db` (the store made unwritable under the open connection: SQLite's
    "disk I/O error") during `bench train`: two chained tracebacks (209 lines) with MLflow's raw SQL, raised again by
    the run's own end, no resume command, the run RUNNING. Now one `stopped:` line naming the store and the cause,
    the checkpoint kept, how the run is ended, and the resume; made writable again, the resume finishes the run.
    (Each command a process of its own, as the user's.)"""
    import shutil
    import subprocess

    from tests import launch
    from tests.bench.test_signals import BENCH, env, statuses
    from tests.conftest import fresh_store

    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("making a file immutable needs root and chattr")
    uri = fresh_store(tmp_path)
    db = tmp_path / "mlflow.db"
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip(f"the file system of {tmp_path} has no immutable flag")
    subprocess.run(["chattr", "-i", str(db)], check=True)
    cmd = ["train", "--steps", "4", "--eval-every", "0", "--checkpoint-every", "2", "--prompts-per-step", "2",
           "--group-size", "2", "--eval-problems", "4", "--samples-every", "0", "--max-new-tokens", "8",
           "--run-name", "ro"]
    try:
        done = launch.run([sys.executable, "-c", FREEZE_AT_STEP_2, *cmd], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env())
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)
    err = done.stderr
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("bench: warning")]
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in err, err[-4000:]
    line = lines[0]
    assert line.startswith(f"bench train: stopped: the MLflow store {db} could not be written (SQLite: disk I/O "
                           "error: "), line
    assert "kept: the checkpoint of step 2 in .pobench/runs/pobench/ro/ckpt-0000002" in line, line
    assert line.endswith(" --resume"), line
    resume = line.rsplit("resume with: ", 1)[1].split()
    assert resume[:2] == ["bench", "train"] and resume[2:] == [*cmd[1:], "--resume"], line
    done = launch.run([*BENCH, *resume[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert statuses(uri, "pobench") == ["FINISHED"], statuses(uri, "pobench")


def test_a_full_disk_under_bench_report_names_the_figure_being_written(tmp_path):
    """Held-out round 16 (H32): `bench report --out-root <a full disk>`: "no space left on device while writing a
    file (...)", naming nothing: the write that met the full disk was a figure's PNG, which matplotlib writes through
    Pillow (whose error carries no file name). Now the line names the file (in the report's temporary folder, under
    the out-root); exit 1, nothing half-written left as the report."""

    from tests.bench.test_held_out_round15_faults import ROOT, _private_mounts
    from tests.conftest import fresh_store
    from tests.reports.conftest import log_comparison

    _private_mounts()
    uri = fresh_store(tmp_path / "st")
    log_comparison(uri, experiment="full", comparison="c1")
    work = tmp_path / "w"
    work.mkdir()
    command = [sys.executable, "-m", "bench", "report", "--comparison", "c1", "--experiment", "full", "--tracking-uri",
               uri, "--out-root", f"{work}/rep", "--no-store"]
    mounts = [f"mount -t tmpfs -o size=600k tmpfs {work}",
              f"(dd if=/dev/zero of={work}/filler bs=4k 2>/dev/null; truncate -s -172K {work}/filler)"]
    done = launch.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, mounts=mounts,
                      env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"bench report: stopped: no space left on device while writing {work}/rep/full/"), \
        lines[0]
    assert "while writing a file" not in lines[0] and "(No space left on device): free space" in lines[0], lines[0]


def test_a_users_file_where_the_lock_folder_goes_is_refused_before_any_work(bench_here, tmp_path):
    """Held-out round 17 (H25): the user's plain file `.locks` in the folder where `bench warmstart --out ws` keeps
    its lock: `stopped: .locks: File exists (something not pobench's is in the way); move it away`, exit 1 (a fault
    during the work) for what is refused before any. Now one line naming the file and the way on, exit 2; the
    file kept, nothing made. The same for a run folder's lock (`bench train`)."""
    (tmp_path / ".locks").write_text("userdata")
    rc, _, err = bench_here(["warmstart", "--steps", "2", "--eval", "0", "--no-progress", "--out", "ws"], tmp_path)
    assert rc == 2, err
    assert err.strip() == ("bench warmstart: error: .locks: a file that is not pobench's is where pobench keeps its "
                           "lock files (.locks): move it away, then run the same command again"), err
    assert (tmp_path / ".locks").read_text() == "userdata"
    runs = tmp_path / ".pobench" / "runs" / "pobench"
    runs.mkdir(parents=True)
    (runs / ".locks").write_text("mine")
    rc, _, err = bench_here(["train", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                             "--eval-problems", "4", "--run-name", "r"], tmp_path)
    assert rc == 2 and "a file that is not pobench's is where pobench keeps its lock files" in err, err
    assert (runs / ".locks").read_text() == "mine"


def test_an_out_root_holding_an_experiment_s_runs_is_named_as_such(bench_here, tmp_path):
    """Held-out round 17 (H22, H26): `bench train --output-dir .` made `./pobench/<run>`; then `bench run ...
    --output-dir . --out-root .` and `bench report --out-root .` were refused with "./pobench exists and was not created
    by pobench: ... move it away" (pobench made it; moving it moves the experiment's runs). Now `bench run` names the
    clash of its runs and its report, and `bench report` says the folder holds run folders and to leave it."""
    tiny = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4"]
    rc, _, err = bench_here(["train", *tiny, "--output-dir", ".", "--run-name", "docs"], tmp_path)
    assert rc == 0, err[-3000:]
    rc, _, err = bench_here(["run", "--algos", "grpo", "--seeds", "0", "--no-controls", "--workers", "1", *tiny,
                             "--output-dir", ".", "--out-root", "."], tmp_path)
    assert rc == 2 and err.strip() == (
        "bench run: error: --output-dir . and --out-root . put the runs and the report of experiment 'pobench' in "
        "one folder (pobench): give them different folders (the defaults are .pobench/runs and reports/out)"), err
    rc, _, err = bench_here(["report", "--out-root", "."], tmp_path)
    assert rc == 2 and err.strip() == (
        f"bench report: error: {tmp_path / 'pobench'} holds pobench's run folders (an --output-dir's runs): not "
        "writing reports into it; choose another --out-root (the default is reports/out), and leave that folder "
        "where it is"), err
    assert (tmp_path / "pobench" / "docs" / "config.yaml").exists()


def test_a_data_file_rewritten_while_bench_run_trains_fails_the_later_pairs_not_mixes_them(bench_here, monkeypatch,
                                                                                          tmp_path):
    """Held-out round 17 (H29): `bench run --task gsm8k --data d.jsonl --algos grpo,dapo` with the file rewritten
    while grpo trained: dapo trained on the new rows under the old rows' comparison id (a mixed comparison, exit 0,
    no word). Now a pair whose inputs are no longer those the comparison was planned with fails in one line, exit 1,
    and makes no run folder (its rerun plans a new comparison of the new data)."""
    import dataclasses
    import json

    from bench.cli import run as run_command
    from tests.bench import fake_trainer

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"{i} + 1\n#### {i + 1}"}) + "\n"
                            for i in range(8)))
    real = run_command.run_comparison

    def rewrite_during_the_first_pair(cfg, **kw):
        if cfg.algo == "grpo":
            data.write_text(data.read_text().replace("#### ", "#### 1"))
        return fake_trainer.fake_train(cfg, **kw)

    monkeypatch.setattr(run_command, "run_comparison", lambda spec: real(dataclasses.replace(
        spec, train_fn=rewrite_during_the_first_pair, step0_fn=fake_trainer.fake_step0)))
    argv = ["run", "--task", "gsm8k", "--data", "d.jsonl", "--eval-data", "d.jsonl", "--algos", "grpo,dapo",
            "--seeds", "0", "--no-controls", "--workers", "1", "--steps", "2", "--prompts-per-step", "2",
            "--group-size", "2", "--eval-problems", "4", "--no-report", "--no-progress"]
    rc, out, err = bench_here(argv, tmp_path)
    assert rc == 1, out + err
    said = out + err
    assert "dapo seed 0: failed: its inputs changed since the comparison started (d.jsonl): it would train on other " \
           "inputs than the pairs before it" in said, said
    assert "grpo seed 0: finished" in said, said
    assert not any("dapo" in p.name for p in (tmp_path / ".pobench" / "runs" / "pobench").iterdir() if p.is_dir())
