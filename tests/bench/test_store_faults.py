"""Faults of the MLflow store and the file system, as issue 29's new user met them in `bench train`, `bench run` and
`bench report`: a read-only `mlflow.db` or working folder, a truncated or non-SQLite `mlflow.db`, a store of another
MLflow schema revision, a plain path as tracking URI, a run folder that cannot be written, a leftover temporary
checkpoint, `--output-dir` / `--out-root` naming a file. Each is one line naming the cause, the path or URI and what
to do, with the documented exit code (2 when found before any work, 1 when met during it), and no traceback.

Real files, a real SQLite store (a comparison trained by the fake trainer, tests/bench/fake_trainer.py) and real
processes where the fault is a read-only file system: a read-only bind mount in a private mount namespace
(``unshare -m``) when the tests run as root (whom permissions do not stop), ``chmod`` otherwise."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests import launch
from tests.conftest import copy_project, fresh_store

ROOT = Path(__file__).resolve().parents[2]
FAKE_CLI = [sys.executable, str(ROOT / "tests" / "bench" / "fake_trainer.py")]
TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8", "--samples-every",
        "0", "--checkpoint-every", "1", "--eval-problems", "4"]
RUN = ["run", "--algos", "grpo", "--seeds", "0", "--workers", "1", "--no-progress", "--eval-every", "1", *TINY]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> Path:
    """A working folder with a finished comparison (`bench run`, fake trainer) in its default store ``mlflow.db``
    (run in this process, as ``bench_here`` runs a command: the tests' subject is what comes after it)."""
    from mlflow.tracking._tracking_service import utils

    from bench.cli.main import main
    from tests.bench import fake_trainer

    work = tmp_path_factory.mktemp("compared")
    fresh_store(work)
    with pytest.MonkeyPatch.context() as mp:
        fake_trainer.inject(mp.setattr)
        for k in [k for k in os.environ if k.startswith("MLFLOW_")]:
            mp.delenv(k)
        mp.setattr(utils, "_tracking_uri", None)
        mp.chdir(work)
        assert main([*RUN, "--no-report"]) == 0
    return work


@pytest.fixture
def work(compared, tmp_path) -> Path:
    return copy_project(compared, tmp_path / "w")  # (its store's files beside it: H21)


@pytest.fixture
def bench(bench_here, monkeypatch):
    """``bench(work, argv, read_only=()) -> (exit code, stderr lines)``: `bench ARGV` with the fake trainer injected,
    in ``work``, the paths ``read_only`` made read-only for it (MLflow's INFO lines left out). With ``read_only`` it
    is a process of its own (forked by tests/launch.py, in a private mount namespace with read-only bind mounts when
    root); otherwise it runs in
    this process (``bench_here``: what is tested is the command's line, exit code and files, not its process, and
    a new process costs seconds of CPU in imports)."""
    from tests.bench import fake_trainer

    def run(work: Path, argv: list[str], read_only: list[str] = ()) -> tuple[int, list[str]]:
        if not read_only:
            fake_trainer.inject(monkeypatch.setattr)
            rc, _, err = bench_here(argv, work)
            return rc, [ln for ln in err.splitlines() if ln.strip() and " INFO mlflow" not in ln]
        mounts = []
        if os.geteuid() == 0:
            if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
                pytest.skip("running as root without a private mount namespace (unshare -m): no read-only file system")
            mounts = [f"mount --bind {p} {p} && mount -o remount,bind,ro {p}" for p in read_only]
        else:
            for p in read_only:
                (work / p).chmod(0o555 if (work / p).is_dir() else 0o444)
        done = launch.run([*FAKE_CLI, *argv], cwd=work, env=_env(), capture_output=True, text=True, timeout=600,
                          mounts=mounts)
        return done.returncode, [ln for ln in done.stderr.splitlines() if ln.strip() and " INFO mlflow" not in ln]

    return run


def one_line(lines: list[str], *parts: str) -> str:
    assert len(lines) == 1 and "Traceback" not in lines[0], "\n".join(lines[-40:])
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def running(work: Path) -> list[str]:
    db = sqlite3.connect(f"file:{work / 'mlflow.db'}?mode=ro", uri=True)
    return [r[0] for r in db.execute("select run_uuid from runs where status = 'RUNNING'")]


COMMANDS = {"train": ["train", "--eval-every", "0", *TINY], "run": [*RUN[:4], "1", *RUN[5:]], "report": ["report"]}


# ------------------------------------------------------------------ the store
@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_read_only_store_is_one_line_before_any_work(work, bench, command):
    """MLflow's `attempt to write a readonly database`, with its logged tracebacks, after the model loaded."""
    rc, lines = bench(work, COMMANDS[command], read_only=["mlflow.db"])
    assert rc == 2, lines[-40:]
    one_line(lines, f"bench {command}: error: ", str(work / "mlflow.db"), "read-only")
    assert not (work / ".pobench" / "runs" / "pobench" / "grpo-s1").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "report"])
def test_a_read_only_working_folder_is_one_line_before_any_work(work, bench, command):
    """SQLite writes its journal beside the store: a read-only folder makes the store read-only too."""
    rc, lines = bench(work, COMMANDS[command], read_only=["."])
    assert rc == 2, lines[-40:]
    one_line(lines, f"bench {command}: error: ", str(work), "read-only")


@pytest.mark.parametrize("damage", ["truncated", "text"])
@pytest.mark.parametrize("command", ["train", "report"])
def test_a_damaged_or_foreign_store_file_is_one_line(work, bench, command, damage):
    db = work / "mlflow.db"
    if damage == "truncated":
        os.truncate(db, 8192)
    else:
        db.write_text("my notes\n")
    before = db.read_bytes()
    rc, lines = bench(work, COMMANDS[command])
    assert rc == 2, lines[-40:]
    one_line(lines, f"bench {command}: error: ", str(db), "move it away")
    assert db.read_bytes() == before  # pobench never writes into it


@pytest.mark.parametrize("newer", [True, False], ids=["newer", "older"])
def test_a_store_of_another_schema_revision_says_which_way_to_go(work, bench, newer):
    """MLflow's message advises `mlflow db upgrade` whatever the revision; for a store written by a NEWER MLflow that
    would fail (its revision is unknown here): the line says to upgrade MLflow instead."""
    db = sqlite3.connect(work / "mlflow.db")
    db.execute("update alembic_version set version_num = ?", ("ffffffffffff" if newer else "0584bdc529eb",))
    db.commit()
    db.close()
    rc, lines = bench(work, COMMANDS["train"])
    assert rc == 2, lines[-40:]
    line = one_line(lines, "bench train: error: ", str(work / "mlflow.db"))
    if newer:
        assert "newer MLflow" in line and "pip install -U mlflow" in line and "db upgrade" not in line, line
    else:
        assert "older MLflow" in line and "mlflow db upgrade" in line, line


@pytest.mark.parametrize("uri", ["store", "/abs/store", "file:store"])
def test_a_plain_path_as_tracking_uri_is_one_line(work, bench, uri):
    rc, lines = bench(work, [*COMMANDS["train"], "--tracking-uri", uri.replace("/abs", str(work))])
    assert rc == 2, lines[-40:]
    one_line(lines, "bench train: error: ", "sqlite:///", "MLFLOW_ALLOW_FILE_STORE")


# ------------------------------------------------------------------ the file system
@pytest.mark.parametrize("command, flag", [("train", "--output-dir"), ("run", "--output-dir"),
                                           ("report", "--out-root")])
def test_a_file_named_as_an_output_folder_is_one_line(work, bench, command, flag):
    (work / "afile").write_text("mine\n")
    rc, lines = bench(work, [*COMMANDS[command], flag, "afile"])
    assert rc == 2, lines[-40:]
    one_line(lines, f"bench {command}: error: {flag} afile", "not a folder")
    assert (work / "afile").read_text() == "mine\n"


@pytest.mark.slow
def test_a_run_folder_that_cannot_be_written_is_one_line_and_no_run_is_left_running(work, bench):
    """The run folder (pobench's, marked) is on a read-only file system: its MLflow run must not stay RUNNING."""
    run_dir = work / ".pobench" / "runs" / "pobench" / "mine"
    run_dir.mkdir(parents=True)
    (run_dir / ".pobench-owned").write_text("run\n")
    rc, lines = bench(work, ["train", "--eval-every", "0", "--run-name", "mine", *TINY],
                      read_only=[str(run_dir.relative_to(work))])
    assert rc in (1, 2), lines[-40:]
    one_line(lines, "bench train: ", ".pobench/runs/pobench/mine", "read-only")
    assert not running(work)


@pytest.mark.parametrize("leftover", ["ckpt-0000001.tmp", ".final.tmp"])
def test_a_leftover_temporary_file_in_a_run_folder_is_one_line_and_kept(work, bench, leftover):
    """A file where pobench writes its temporary checkpoint / final folder (pobench writes folders there, so it is
    not pobench's): one line naming it, kept as it is, no run left RUNNING. (Since held-out round 13, H23: refused
    before any work, exit 2, as every name of the run folder's layout holding the other kind.)"""
    run_dir = work / ".pobench" / "runs" / "pobench" / "mine"
    run_dir.mkdir(parents=True)
    (run_dir / ".pobench-owned").write_text("run\n")
    (run_dir / leftover).write_text("not pobench's\n")
    rc, lines = bench(work, ["train", "--eval-every", "0", "--run-name", "mine", *TINY])
    assert rc == 2, lines[-40:]
    one_line(lines, "bench train: error: ", str(Path(".pobench/runs/pobench/mine") / leftover), "move it away")
    assert (run_dir / leftover).read_text() == "not pobench's\n"
    assert not running(work)


def test_a_store_fault_met_during_the_work_is_described_from_the_real_error(tmp_path):
    """The mechanism every command ends with (bench/cli/main.py: ``bench.faults.describe``), on the errors SQLite,
    SQLAlchemy and MLflow really raise: a write to a read-only database, inside MLflow's own exception too."""
    import sqlalchemy
    from mlflow.exceptions import MlflowException

    from bench import faults

    db = tmp_path / "mlflow.db"
    sqlite3.connect(db).execute("create table t (x)").connection.commit()
    engine = sqlalchemy.create_engine(f"sqlite:///file:{db}?mode=ro&uri=true")
    with pytest.raises(sqlalchemy.exc.OperationalError) as raised:
        with engine.begin() as con:
            con.execute(sqlalchemy.text("insert into t values (1)"))
    uri = f"sqlite:///{db}"
    for error in (raised.value, MlflowException(str(raised.value))):
        line = faults.describe(error, store=uri)
        assert line is not None and line.startswith(f"the MLflow store {uri} became read-only"), line
    assert faults.describe(ValueError("a bug")) is None  # anything else keeps its traceback
    full = OSError(28, "No space left on device", str(tmp_path / "x"))
    assert faults.describe(full) == f"no space left on device while writing {tmp_path / 'x'} (No space left on " \
                                    "device): free space"


def test_a_store_deleted_while_in_use_is_said_to_be_gone_not_read_only(tmp_path):
    """Held-out round 5: `mlflow.db` deleted while `bench run` trained was reported as "became read-only: make it
    writable" (SQLite's error for a file unlinked under an open connection). Now the line says the store is gone."""
    import sqlalchemy

    from bench import faults

    db = tmp_path / "mlflow.db"
    sqlite3.connect(db).execute("create table t (x)").connection.commit()
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    with engine.begin() as con:  # the connection is open (pooled) when the file goes
        con.execute(sqlalchemy.text("insert into t values (1)"))
    db.unlink()
    with pytest.raises(sqlalchemy.exc.OperationalError) as raised:
        with engine.begin() as con:
            con.execute(sqlalchemy.text("insert into t values (2)"))
    line = faults.describe(raised.value, store=f"sqlite:///{db}")
    assert line is not None and f"is gone from {db} while in use" in line, (str(raised.value), line)
    assert "read-only" not in line
    # held-out round 17 (H08): the project folder renamed mid-run (`mv proj proj2`) is the same error; the line said
    # only "deleted ... with every run it held" and "rerun (a new store starts)", splitting the run's history in two
    # stores: it names the move first, and where to rerun
    assert "(its folder moved or renamed, or the file deleted): if the folder was moved, rerun from its new place" \
        in line, line


def test_a_file_size_limit_in_bench_report_is_one_line_and_leaves_no_folder(tmp_path):
    """Held-out round 5: `ulimit -f 1` then `bench report`: OSError [Errno 27] File too large with a traceback (the
    error names no file, and the line needed one). Now one line, exit 1, and no half-written report folder."""
    from tests.reports.conftest import log_comparison

    uri = fresh_store(tmp_path)
    log_comparison(uri, experiment="pobench")

    done = launch.run([sys.executable, "-m", "bench.cli", "report", "--tracking-uri", uri], cwd=tmp_path,
                      capture_output=True, text=True, timeout=300, file_size_limit=1024)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("bench report")]
    assert len(lines) == 1 and "File too large: the file-size limit, ulimit -f" in lines[0], done.stderr[-3000:]
    # (no report folder, whole or half: the marker and the report's lock folder only)
    assert sorted(p.name for p in (tmp_path / "reports" / "out" / "pobench").iterdir()) == [".locks", ".pobench-owned"]


# ------------------------------------------------------------------ held-out round 9
def test_a_sigterm_while_a_new_store_is_created_leaves_it_whole_or_absent(tmp_path):
    """Held-out round 9 (H20): SIGTERM while MLflow created its tables in a new `mlflow.db` left a half-made store,
    which the next command refused ("written by an older MLflow ... run mlflow db upgrade", or "not MLflow's"; `bench
    run` makes the store outside a run's calls, which hold a signal). The store is made beside its path and renamed
    into place when complete. The process is the subject (a signal; started as `python -m bench`, which now stops as
    `bench` does), so it is one of its own, stopped as soon as MLflow has written its first tables."""
    import signal
    import time

    from bench import faults

    db = tmp_path / "mlflow.db"

    def begun() -> bool:  # MLflow has written its first tables (the old code made them in `mlflow.db` itself)
        for p in tmp_path.iterdir():
            if p.name == db.name or p.name.startswith(f".{db.name}"):
                with contextlib.suppress(FileNotFoundError):  # (renamed meanwhile)
                    if p.stat().st_size:
                        return True
        return False

    proc = launch.Popen([sys.executable, "-m", "bench", *RUN[:4], "1", *RUN[5:], "--no-report"], cwd=tmp_path,
                        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not begun():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO mlflow" not in ln]
    assert proc.returncode == 143 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("bench run: stopped by SIGTERM; kept nothing"), lines
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".mlflow.db")]
    faults.check_store(f"sqlite:///{db}")  # whole (at MLflow's revision, every table) or absent: the next takes it


def _no_aws_credentials(tmp_path, monkeypatch) -> None:
    """boto3 installed, and no AWS credentials anywhere it looks (nor an instance's metadata service)."""
    pytest.importorskip("boto3")
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    for k, v in {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
                 "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("where", ["proc", "under-a-file", "s3"])
def test_an_experiment_whose_files_cannot_be_stored_is_one_line(tmp_path, bench_here, monkeypatch, where):
    """Held-out round 9 (H21, H22): an experiment made beforehand with an artifact location pobench cannot write
    (`/proc/nope/arts`; a path under a file) was `error: [Errno 2] No such file or directory: '/proc/nope'` after a
    FAILED run and its folder were made; one on S3 without credentials a botocore traceback, the run FAILED. Now a
    local folder is checked before any work, one line naming the experiment and its location; a remote place is met
    at the run's first file: one `stopped:` line, the run ended FAILED."""
    from mlflow import MlflowClient

    if where == "s3":
        _no_aws_credentials(tmp_path, monkeypatch)
    (tmp_path / "afile").write_text("mine\n")
    location = {"proc": "/proc/nope/arts", "under-a-file": str(tmp_path / "afile" / "arts"),
                "s3": "s3://nobucket/arts"}[where]
    uri = fresh_store(tmp_path)
    MlflowClient(uri).create_experiment("x", artifact_location=location)
    rc, _, err = bench_here(["train", "--experiment", "x", "--eval-every", "0", "--no-progress", *TINY], tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO mlflow" not in ln]
    statuses = [s for (s,) in sqlite3.connect(tmp_path / "mlflow.db").execute("select status from runs")]
    if where == "s3":
        assert rc == 1, lines
        one_line(lines, "bench train: stopped: experiment 'x' keeps its runs' files at s3://nobucket/arts, which "
                        "refused config.yaml (NoCredentialsError", "give another --experiment")
        assert statuses == ["FAILED"]
    else:
        assert rc == 2, lines
        one_line(lines, f"bench train: error: experiment 'x' keeps its runs' files in {location}, which cannot be "
                        "written", "give another --experiment")
        assert statuses == [] and not (tmp_path / ".pobench" / "runs" / "x").exists()
    assert (tmp_path / "afile").read_text() == "mine\n"


@pytest.mark.parametrize("argv", [
    pytest.param(["run", "--algos", "grpo", "--seeds", "0", "--no-controls", "--steps", "2", "--no-progress"],
                 id="run"),
    pytest.param(["tune", "--algo", "grpo", "--trials", "1", "--steps", "2"], id="tune"),
    pytest.param(["eval", "--benchmarks", "arith", "--limit", "2", "--max-new-tokens", "8"], id="eval")])
def test_a_cloud_place_refusing_the_files_of_bench_run_tune_eval_is_one_line(tmp_path, bench_here, monkeypatch, argv):
    """Held-out round 9's leftover: the files a command stores outside a training run (the comparison run's
    config.yaml, the report, the study's outputs, `bench eval`'s results) on S3 without credentials were botocore's
    traceback (`bench tune`: Optuna's traceback of the failed trial too). Now one `stopped:` line naming the refusal
    and what to do, exit 1, no run left RUNNING; `bench eval`'s results are in its local folder all the same."""
    from mlflow import MlflowClient

    from tests.bench import fake_trainer

    _no_aws_credentials(tmp_path, monkeypatch)
    fake_trainer.inject(monkeypatch.setattr)
    MlflowClient(fresh_store(tmp_path)).create_experiment("x", artifact_location="s3://nobucket/arts")
    for handler in logging.getLogger("optuna").handlers:  # (Optuna's lines to this test's stderr, as to a user's;
        for holder in (handler, handler.formatter):     # its colouring formatter keeps the stream it was made with)
            if hasattr(holder, "stream"):
                monkeypatch.setattr(holder, "stream", sys.stderr)
    rc, _, err = bench_here([*argv, "--experiment", "x"], tmp_path)
    lines = [ln for ln in err.splitlines() if ln.startswith(("bench", "[W", "Traceback"))
             and not ln.startswith(("bench eval: --max-new-tokens", "bench eval: arith: 2 problems"))]
    assert rc == 1 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and "NoCredentialsError: Unable to locate credentials" in lines[0], lines
    assert lines[0].startswith(f"bench {argv[0]}: stopped: "), lines
    assert "give another --experiment" in lines[0] and "credentials" in lines[0], lines
    statuses = [s for (s,) in sqlite3.connect(tmp_path / "mlflow.db").execute("select status from runs")]
    assert statuses and "RUNNING" not in statuses, statuses
    if argv[0] == "eval":
        assert list((tmp_path / ".pobench" / "eval").glob("*/results.json"))


def test_a_store_missing_one_of_mlflows_tables_is_damaged_one_line_before_any_work(tmp_path, bench_here):
    """Held-out round 9 (H23): a store at MLflow's schema revision whose `latest_metrics` table was dropped gave six
    tracebacks ("no such table"), exit 1, and a run left RUNNING. Now the tables are checked with the revision, before
    any work: one line naming the missing table, the store untouched."""
    fresh_store(tmp_path)
    db = tmp_path / "mlflow.db"
    con = sqlite3.connect(db)
    con.execute("drop table latest_metrics")
    con.commit()
    con.close()
    before = db.read_bytes()
    rc, _, err = bench_here(["train", "--eval-every", "0", "--no-progress", *TINY], tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO mlflow" not in ln]
    assert rc == 2, lines
    one_line(lines, f"bench train: error: the MLflow store {db} is damaged (no such table: latest_metrics); restore "
                    "it from a backup")
    assert db.read_bytes() == before


@pytest.mark.parametrize("code, why", [(errno.EROFS, "a read-only file system"),
                                       (errno.EACCES, "Permission denied: no permission")])
def test_a_file_that_cannot_be_written_is_named_once_with_its_cause(code, why):
    """Held-out round 13 (H11): `bench tune --show --out` on a read-only mount said "(Read-only file system: a
    read-only file system)": the cause twice in other words. Once now (the system's words kept where they add)."""
    from bench import faults

    line = faults.describe(OSError(code, os.strerror(code), "/data/out/contour.png"))
    assert line == f"/data/out/contour.png cannot be written ({why}); make it writable, or choose another folder"
