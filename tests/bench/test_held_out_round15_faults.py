"""Held-out round 15 (issue 29): a data folder whose split files are named pipes (H17), a PostgreSQL Optuna storage
whose database does not exist (H23), a plugin's NaN advantage in `bench tune` (H11), the MLflow store's disk full
(H04, H07): each one line naming the cause and a way out, with its exit code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import launch
from tests.bench.test_held_out_round14_stores import statuses

TINY = ["--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--samples-every", "0"]


def only_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------ H17: named pipes as a data folder's split files
def test_named_pipes_as_a_data_folders_split_files_are_refused_as_pipes(bench_here, tmp_path):
    """H17: `mkfifo dd/train.jsonl dd/test.jsonl; bench eval --benchmarks gsm8k --data gsm8k=dd` said "no data for
    split 'test': expected test.jsonl ...; found: test.jsonl, train.jsonl" (self-contradictory): now the pipe is
    named as not a regular file, exit 2, nothing read from it (an open would block)."""
    dd = tmp_path / "dd"
    dd.mkdir()
    for name in ("train.jsonl", "test.jsonl"):
        os.mkfifo(dd / name)
    rc, _, err = bench_here(["eval", "--benchmarks", "gsm8k", "--data", "gsm8k=dd", "--limit", "2", "--no-mlflow",
                             "--out", "ev"], tmp_path)
    assert rc == 2, err
    assert only_line(err) == ("bench eval: error: dd/test.jsonl: not a regular file (a pipe or device); write the "
                              "rows to a JSONL / JSON / parquet file in its place")


# ------------------------------------------------------------------ H23: the PostgreSQL storage's database missing
def test_a_postgresql_storage_whose_database_does_not_exist_says_create_it(bench_here, tmp_path, postgres):
    """H23: `bench tune --storage postgresql://postgres@host:port/nosuchdb` (server up) said "--storage
    postgresql+psycopg2://...: cannot be reached: ... does not exist": a driver the user did not write, "cannot be
    reached" though the server answered, no way out. Now: the URL as written, and `createdb` for it; exit 2, and the
    database is not made by pobench."""
    url = f"postgresql://postgres@127.0.0.1:{postgres.port}/nosuchdb"
    rc, _, err = bench_here(["tune", "--algo", "grpo", "--trials", "1", "--steps", "2", *TINY, "--storage", url,
                             "--study", "x"], tmp_path)
    assert rc == 2, err
    assert only_line(err) == (
        f"bench tune: error: --storage {url}: the database server answered, but database \"nosuchdb\" does not "
        f"exist: create the database (createdb -h 127.0.0.1 -p {postgres.port} -U postgres nosuchdb), or fix "
        "--storage")


# ------------------------------------------------------------------ H11: a plugin's NaN advantage in bench tune
NAN_PLUGIN = '''
from algorithms import register, register_advantage


def nan_advantages(rewards):
    return rewards * float("nan")


register_advantage("adv-nan-r15", nan_advantages, description="returns NaN (a broken plugin)")
register("grpo-nan-r15", base="grpo", description="grpo with the broken estimator", advantage_estimator="adv-nan-r15")
'''


def test_a_plugins_nan_advantage_in_bench_tune_is_a_fault_during_work_naming_its_file(bench_here, tmp_path):
    """H11: `bench tune --plugin p_nan.py --algo grpo-nan` ended rc 2 ("bad input refused before any work") after the
    study was made and its trial trained, the plugin's file not named. Now rc 1, the estimator and its file:line named,
    the trial's run ended FAILED (not left RUNNING)."""
    from algorithms import unregister, unregister_advantage

    plugin = tmp_path / "p_nan.py"
    plugin.write_text(NAN_PLUGIN)
    try:
        rc, _, err = bench_here(["tune", "--plugin", "p_nan.py", "--algo", "grpo-nan-r15", "--trials", "1",
                                 "--steps", "1", *TINY, "--workers", "1", "--study", "n"], tmp_path)
    finally:
        unregister("grpo-nan-r15")
        unregister_advantage("adv-nan-r15")
    lines = [ln for ln in err.splitlines() if ln.startswith("bench tune:")]
    assert rc == 1 and len(lines) == 1, err[-3000:]
    assert lines[0] == (f"bench tune: error: advantage estimator 'adv-nan-r15' (nan_advantages in {plugin}:5) returned "
                        "a non-finite advantage (NaN or inf): fix it"), err[-3000:]
    assert "RUNNING" not in {status for _, status in statuses(tmp_path / "mlflow.db")}


# ------------------------------------------------------------------ H07 / H04: the MLflow store's disk full
ROOT = Path(__file__).resolve().parents[2]
RUN = [sys.executable, str(ROOT / "tests" / "bench" / "fake_trainer.py"), "run", "--algos", "grpo,dapo", "--seeds",
       "0", "--no-controls", "--workers", "2", "--steps", "400", "--checkpoint-every", "5", "--eval-every", "0",
       "--no-report", "--no-progress"]


def _private_mounts() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None or \
            subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("a full disk needs a small tmpfs in a private mount namespace (root, unshare -m): not available")


@pytest.mark.slow
def test_the_stores_disk_filling_during_bench_run_says_the_store_and_rerun_in_one_line_each(tmp_path):
    """H07: the disk holding mlflow.db filled during `bench run --workers 2` (a 2 MB tmpfs, 100 KiB left): SQLAlchemy's
    multi-line text in a warning, and lines saying "free space" only, while the rerun is what ends the runs. Now each
    pair's line names the store file and says to rerun the same command; no raw SQL; the rerun (space freed)
    finishes every run."""
    _private_mounts()
    from tests.conftest import fresh_store

    src, work, out = tmp_path / "src", tmp_path / "w", tmp_path / "out"
    fresh_store(src)
    work.mkdir()
    mounts = [f"mount -t tmpfs -o size=2m tmpfs {work}", f"cp {src / 'mlflow.db'} {work}",
              f"(dd if=/dev/zero of={work}/filler bs=4k 2>/dev/null; truncate -s -100K {work}/filler)"]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}, "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    with launch.mount_holder(tmp_path, mounts) as holder:  # (the tmpfs both commands use, one after the other)
        def bench_run() -> subprocess.CompletedProcess:
            return launch.run([*RUN, "--output-dir", str(out)], cwd=work, env=env, capture_output=True, text=True,
                              timeout=600, mount_namespace_of=holder)

        first = bench_run()
        os.remove(f"/proc/{holder}/root{work}/filler")  # (space freed)
        second = bench_run()
    lines = [ln for ln in first.stderr.splitlines() if ln.strip() and " INFO mlflow" not in ln]
    assert first.returncode == 1 and lines, first.stderr[-4000:]
    assert all(ln.startswith(("  grpo seed 0: ", "  dapo seed 0: ", "bench run: ")) for ln in lines), \
        first.stderr[-4000:]
    failed = [ln for ln in lines if ": failed: " in ln]
    assert failed, first.stderr[-4000:]
    for line in failed:
        assert f"no space left on device while writing {work}/mlflow.db" in line, line
        assert "then rerun the same command" in line, line
    assert second.returncode == 0, second.stderr[-4000:]


FULL_DISK_WRITES = '''
import os, shutil, sys
from bench import faults

work, source = sys.argv[1], sys.argv[2]
store = f"sqlite:///{work}/mlflow.db"
try:  # MLflow's local artifact store copies a run's files with shutil: its error names the source
    shutil.copyfile(source, f"{work}/mlartifacts/config.yaml")
except OSError as e:
    print(faults.describe(e, store=store))
fd = os.open(f"{work}/mlartifacts/table.json", os.O_WRONLY | os.O_CREAT)
try:  # a write's error carries no file name
    os.write(fd, b"x" * 65536)
except OSError as e:
    print(faults.describe(e, store=store))
'''


def test_a_full_stores_disk_is_named_in_the_line_of_a_write_without_a_file_name(tmp_path):
    """H04: the disk holding mlflow.db / mlartifacts/ filled during `bench train`: "no space left on device while
    writing a file ...: free space" named no file (the one folder the line named, the checkpoints', was on another
    disk). The writes that fail there, on a real full tmpfs: a run's file copied into mlartifacts/ (shutil, whose
    error names the source file: it was named as the file written) and a write without a file name (named now as the
    disk of the store's file). Not `bench train` itself: which write meets the full disk first depends on timing
    (test_the_stores_disk_filling_during_bench_run... runs the command)."""
    _private_mounts()
    work, source = tmp_path / "w", tmp_path / "config.yaml"
    work.mkdir()
    source.write_bytes(b"x" * 20000)
    mounts = [f"mount -t tmpfs -o size=64k tmpfs {work}", f"mkdir {work}/mlartifacts", f"touch {work}/mlflow.db",
              f"dd if=/dev/zero of={work}/filler bs=4k 2>/dev/null; true"]
    done = launch.run([sys.executable, "-c", FULL_DISK_WRITES, str(work), str(source)], cwd=tmp_path,
                      env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
                      mounts=mounts)
    assert done.stdout.splitlines() == [
        f"no space left on device while writing {work}/mlartifacts/config.yaml (No space left on device): free space",
        f"no space left on device on the disk of the MLflow store {work}/mlflow.db (a write there failed) (No space "
        "left on device): free space"], done.stdout + done.stderr[-3000:]


# ------------------------------------------------------------------ H24: a refused bench tune makes no store
def test_a_study_with_other_settings_is_refused_before_the_mlflow_store_is_made(bench_here, monkeypatch, tmp_path):
    """H24: `bench tune --algo dapo --storage <a storage holding study 'pgs' of grpo> --study pgs` in a new folder:
    refused ("exists with different settings"), exit 2, but an empty `mlflow.db` was left in the folder. Now the
    settings are compared before the MLflow store is made: nothing in the folder."""
    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    storage = f"sqlite:///{tmp_path / 'st' / 'opt.db'}"
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    base = ["tune", "--trials", "1", "--steps", "1", *TINY, "--workers", "1", "--storage", storage, "--study", "pgs"]
    rc, _, err = bench_here([*base, "--algo", "grpo"], first)
    assert rc == 0, err[-3000:]
    rc, _, err = bench_here([*base, "--algo", "dapo"], second)
    assert rc == 2, err[-3000:]
    assert "study 'pgs' exists with different settings (algo: study has 'grpo', this command 'dapo'" in \
        only_line(err), err
    assert list(second.iterdir()) == [], list(second.iterdir())


# ------------------------------------------------------------------ H09: a plugin exiting in pool workers
def test_a_plugin_exiting_in_pool_workers_is_said_once_with_what_to_do(bench_here, monkeypatch, tmp_path):
    """H09: a plugin calling sys.exit(3) when imported in a pool worker only: `bench run --workers 2` of 2 pairs printed
    its sentence 7 times (the shared step 0, each pair's progress line and detail, the summary), no advice. Now the
    whole sentence once, with what to do; each pair's lines name the plugin (its file) only; exit 1."""
    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    (tmp_path / "p_wexit.py").write_text(
        "import multiprocessing, sys\nfrom algorithms import register\n"
        "if multiprocessing.current_process().name != 'MainProcess':\n    sys.exit(3)\n"
        "register('grpo-wexit-r15', base='grpo', description='exits in workers')\n")
    try:
        rc, out, err = bench_here(["run", "--plugin", "p_wexit.py", "--algos", "grpo-wexit-r15", "--seeds", "0,1",
                                   "--no-controls", "--workers", "2", "--steps", "2", *TINY, "--no-report",
                                   "--no-progress"], tmp_path)
    finally:
        from algorithms import unregister

        unregister("grpo-wexit-r15")
    text = out + err
    cause = f"plugin {tmp_path / 'p_wexit.py'} failed to load in a worker process: it called sys.exit(3) while imported"
    assert rc == 1 and "Traceback" not in text, text[-3000:]
    assert text.count(cause) == 1, text[-3000:]
    assert f"{cause}: fix the plugin's import" in text and "then rerun the same command" in text, text[-3000:]
    for seed in (0, 1):
        assert f"seed {seed}: failed: plugin {tmp_path / 'p_wexit.py'} failed to load in a worker process" in out, \
            out[-3000:]


# ------------------------------------------------------------------ round 16, H18: warmstart's weights on a full disk
def test_bench_warmstart_on_a_full_disk_is_one_line_naming_the_weights_file(tmp_path):
    """Held-out round 16 (H18): `bench warmstart --out <a 3 MB tmpfs>/ws` (the weights, 3.4 MB, do not fit): a
    30-line traceback ending in safetensors' own `SafetensorError: ... No space left on device (os error 28)`. Now
    one line naming the weights file, exit 1 (a fault during the work); on a larger disk the same command makes the
    model."""
    _private_mounts()
    work = tmp_path / "w"
    work.mkdir()
    command = [sys.executable, "-m", "bench", "warmstart", "--steps", "2", "--eval", "0", "--no-progress", "--out",
               f"{work}/ws"]
    done = launch.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                      env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                      mounts=[f"mount -t tmpfs -o size=3m tmpfs {work}"])
    assert done.returncode == 1, done.stderr[-3000:]
    assert only_line(done.stderr) == (f"bench warmstart: stopped: no space left on device while writing "
                                      f"{work}/ws/model.safetensors (No space left on device): free space")
