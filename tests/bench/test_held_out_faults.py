"""Issue 29's held-out round of faults, each as a user meets it (real files, a real SQLite store, real processes):

- `bench run --force` deletes only what pobench wrote in its own run folder: a user's analysis beside the checkpoints
  stays (and so does a file put inside ``final`` or a checkpoint);
- a pair that fails inside `bench run` (a plugin's advantage estimator returning NaN, in one process or two) is one
  line naming the pair and the cause, no traceback, no "(run None)";
- an experiment name MLflow cannot store is refused before any work, in one line;
- a SIGKILLed `bench run` does not leave its pool processes alive, nor their runs RUNNING;
- a damaged Optuna SQLite file is said to be damaged (not "cannot be reached");
- the comparison's MLflow run is FINISHED only once its report is written;
- `bench report` in a folder without a store says so and creates none.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from bench.runs import checkpoint
from bench.runs.folders import LISTING, claim_run_folder, not_written, remove_run_folder
from reports.paths import MARKER
from tests.bench.test_signals import FAKE_CLI, Proc, checkpointed, statuses
from tests.conftest import fresh_store

TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8", "--samples-every",
        "0", "--checkpoint-every", "1", "--eval-problems", "4", "--eval-every", "0"]


def _lines(err: str) -> list[str]:
    return [ln for ln in err.strip().splitlines() if ln.strip() and " INFO mlflow" not in ln]


# ------------------------------------------------------------------ --force keeps what pobench did not write
def _pobench_run_folder(folder: Path) -> Path:
    """A run folder as pobench writes it, with pobench's own writers: marker, config, a checkpoint, final."""
    claim_run_folder(folder)
    (folder / "config.yaml").write_text("algo: grpo\n")
    (folder / "run.json").write_text("{}")
    checkpoint.save_state(folder, 2, {"note": "x"})
    checkpoint.save_final(folder, lambda d: (d / "config.json").write_text("{}"))
    return folder


def test_force_deletes_only_what_pobench_wrote(tmp_path):
    root = tmp_path / "exp"
    run = _pobench_run_folder(root / "grpo-s0")
    assert json.loads((run / "final" / LISTING).read_text()) == ["config.json"]
    assert not_written(run) == []
    mine = {run / "analysis.txt": "my notes", run / "final" / "thesis.tex": "\\chapter{}",
            run / "ckpt-0000002" / "mine.csv": "a,b", run / "plots" / "fig.png": "png"}
    for path, text in mine.items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert sorted(not_written(run)) == sorted([run / "analysis.txt", run / "ckpt-0000002" / "mine.csv",
                                               run / "final" / "thesis.tex", run / "plots"])
    expected = sorted(not_written(run))
    assert sorted(remove_run_folder(run, root)) == expected
    assert {p: p.read_text() for p in mine} == mine  # every user file, byte for byte
    left = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    assert left == sorted([MARKER, "analysis.txt", "ckpt-0000002", "ckpt-0000002/mine.csv", "final", f"final/{LISTING}",
                           "final/thesis.tex", "plots", "plots/fig.png"])  # pobench's own files are gone
    assert sorted(remove_run_folder(run, root)) == expected  # a second --force: the same files kept
    # training on: a new checkpoint drops the old one, a new final replaces the old one; the user's files stay
    checkpoint.save_state(run, 3, {"note": "y"})
    checkpoint.save_state(run, 4, {"note": "z"})
    checkpoint.save_final(run, lambda d: (d / "config.json").write_text("{}"))
    assert {p: p.read_text() for p in mine} == mine
    assert (run / "final" / "config.json").is_file() and not (run / "ckpt-0000003").exists()
    # a folder holding only pobench's files goes whole
    clean = _pobench_run_folder(root / "grpo-s1")
    assert remove_run_folder(clean, root) == [] and not clean.exists()


@pytest.mark.slow
def test_bench_run_force_keeps_a_users_file_in_the_run_folder_and_retrains(tmp_path, bench_here):
    fresh_store(tmp_path)
    argv = ["run", "--algos", "grpo", "--seeds", "0", "--workers", "1", "--no-progress", "--no-report", *TINY]
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    (run,) = [p for p in (tmp_path / ".pobench" / "runs" / "pobench").iterdir() if p.name != ".locks"]
    (run / "analysis.txt").write_text("hours of work")
    (run / "final" / "notes.md").write_text("# what the final policy does")
    rc, out, err = bench_here(["run", "--force", *argv[1:]], tmp_path)
    assert rc == 0, err[-3000:]
    assert (run / "analysis.txt").read_text() == "hours of work"
    assert (run / "final" / "notes.md").read_text() == "# what the final policy does"
    said = [ln for ln in _lines(err) if ln.startswith("--force: kept")]
    assert len(said) == 1 and "analysis.txt" in said[0] and "final/notes.md" in said[0], err
    assert ": finished" in out and (run / MARKER).is_file()
    assert (run / "final" / "config.json").is_file()  # retrained: the new final weights are there


# ------------------------------------------------------------------ a pair's failure: one line
NAN_PLUGIN = '''
from algorithms import register, register_advantage

register_advantage("nan-adv-{n}", lambda rewards: rewards * float("nan"), description="returns NaN (a broken plugin)")
register("grpo-nan-{n}", base="grpo", description="grpo with the broken estimator", advantage_estimator="nan-adv-{n}")
'''


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_pair_failing_inside_bench_run_is_one_line(tmp_path, bench_here, workers):
    from algorithms import unregister, unregister_advantage

    fresh_store(tmp_path)
    (tmp_path / "broken.py").write_text(NAN_PLUGIN.format(n=workers))  # (names of its own: tests share a process)
    try:
        rc, out, err = bench_here(["run", "--plugin", "broken.py", "--algos", f"grpo-nan-{workers}", "--seeds", "0,1",
                                   "--no-controls", "--workers", workers, "--no-progress", "--no-report", *TINY],
                                  tmp_path)
    finally:
        unregister(f"grpo-nan-{workers}")
        with contextlib.suppress(ValueError):
            unregister_advantage(f"nan-adv-{workers}")
    text = out + err
    assert rc != 0 and "Traceback" not in text, text[-3000:]
    failed = [ln for ln in text.splitlines() if ": failed: " in ln]
    assert failed and all("non-finite advantage" in ln for ln in failed), text[-3000:]
    for seed in (0, 1):  # each pair: one line as it ends (stderr), one in the summary (stdout)
        assert sum(f"seed {seed}: failed: " in ln for ln in err.splitlines()) == 1, err[-3000:]
        assert sum(f"seed {seed}: failed: " in ln for ln in out.splitlines()) == 1, out[-3000:]
    assert "(run None)" not in text
    assert statuses(f"sqlite:///{tmp_path}/mlflow.db", "pobench", "train").count("RUNNING") == 0


# ------------------------------------------------------------------ names MLflow cannot store
def test_an_experiment_name_mlflow_cannot_store_is_refused_before_any_work(tmp_path, bench_here):
    store = fresh_store(tmp_path)
    before = (tmp_path / "mlflow.db").read_bytes()
    rc, _, err = bench_here(["run", "--experiment", "e" * 600, "--algos", "grpo", "--seeds", "0", "--no-progress",
                             *TINY], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1, err[-3000:]
    assert "600 characters" in err and "at most 500" in err and "e" * 100 not in err
    assert (tmp_path / "mlflow.db").read_bytes() == before and not (tmp_path / ".pobench").exists(), store


# ------------------------------------------------------------------ a SIGKILLed parent's pool
@pytest.mark.slow
def test_a_sigkilled_bench_run_leaves_no_pool_process_and_no_run_running(tmp_path):
    (tmp_path / "long.yaml").write_text("steps: 40\neval_every: 0\ncheckpoint_every: 1\nsamples_every: 0\n")
    fresh_store(tmp_path)
    folder = tmp_path / ".pobench" / "runs" / "pobench"
    proc = Proc([*FAKE_CLI, "run", "--config", "long.yaml", "--algos", "grpo,tepo", "--seeds", "0", "--workers", "2",
                 "--no-report", "--no-progress"], tmp_path, FAKE_STEP_S="0.5")
    proc.wait_for(lambda: len(checkpointed(folder)) == 2, "a checkpoint of both pairs")
    os.kill(proc.p.pid, signal.SIGKILL)  # the parent only, as the OOM killer does
    proc.finish(timeout=60)
    try:
        assert proc.group_gone(within=60), "the pool's processes outlived their SIGKILLed parent"
    finally:  # (none left behind for the next test, whatever happened)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.p.pid, signal.SIGKILL)
    train = statuses(f"sqlite:///{tmp_path}/mlflow.db", "pobench", "train")
    assert train == ["KILLED", "KILLED"], train  # each pair checkpointed and ended its run, as on SIGTERM


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


# ------------------------------------------------------------------ the comparison's run ends after its report
def test_the_comparison_run_is_finished_only_once_its_report_is_written(tmp_path, bench_here, monkeypatch):
    from mlflow import MlflowClient

    from bench.comparison import runner as comparison
    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    seen: list[str] = []
    real = comparison.build_report

    def build_report(experiment, cid, uri, **kw):
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(experiment)
        (run,) = client.search_runs([exp.experiment_id], "tags.`pobench.kind` = 'comparison'")
        seen.append(run.info.status)
        return real(experiment, cid, uri, **kw)

    monkeypatch.setattr(comparison, "build_report", build_report)
    fresh_store(tmp_path)
    rc, _, err = bench_here(["run", "--algos", "grpo", "--seeds", "0", "--workers", "1", "--no-progress",
                             "--steps", "2", "--eval-every", "1"], tmp_path)
    assert rc == 0, err[-3000:]
    assert seen == ["RUNNING"]  # the report is written while the run is open ...
    assert statuses(f"sqlite:///{tmp_path}/mlflow.db", "pobench", "comparison") == ["FINISHED"]  # ... then ended


# ------------------------------------------------------------------ bench report where there is no store
@pytest.mark.parametrize("argv", [["report"], ["compare", "a", "b"]])
def test_a_reading_command_without_a_store_says_so_and_creates_none(tmp_path, bench_here, argv):
    t0 = time.perf_counter()
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "no MLflow store at" in err, err[-3000:]
    assert list(tmp_path.iterdir()) == [] and time.perf_counter() - t0 < 60


def test_bench_run_refuses_a_foreign_folder_in_a_pairs_place_before_any_record(tmp_path, bench_here):
    """Without --force, a folder that is not pobench's where a pair's run folder goes was found only once the
    comparison's MLflow run was open (and the pair failed with a traceback): one line, exit 2, before any record."""
    from mlflow import MlflowClient

    from bench.comparison.plan import base_config, plan, run_dir

    fresh_store(tmp_path)
    cfg = base_config(None, steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8, samples_every=0,
                      checkpoint_every=1, eval_problems=4, eval_every=0)
    _, (pair,) = plan(cfg, ["grpo"], [0], {"grpo": {}})
    target = tmp_path / run_dir(cfg, pair)
    target.mkdir(parents=True)
    (target / "mine.txt").write_text("notes")
    rc, _, err = bench_here(["run", "--algos", "grpo", "--seeds", "0", "--no-controls", "--workers", "1",
                             "--no-progress", "--no-report", *TINY], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "not writing into it" in err, err[-3000:]
    assert (target / "mine.txt").read_text() == "notes" and sorted(p.name for p in target.iterdir()) == ["mine.txt"]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])


# ------------------------------------------------------------------ --out of bench tune / bench eval
@pytest.mark.parametrize("argv", [["tune", "--algo", "grpo", "--trials", "1", *TINY[:-2], "--eval-every", "1"],
                                  ["eval", "--benchmarks", "arith", "--limit", "2", "--max-new-tokens", "4",
                                   "--no-mlflow"]], ids=["tune", "eval"])
def test_an_out_folder_holding_a_users_files_is_refused_before_any_work(tmp_path, bench_here, argv):
    """`--out mine` where mine/ holds the user's best.yaml / results.json (names pobench writes there): they were
    overwritten; now one line, exit 2, nothing in the folder touched, before any study or evaluation."""
    fresh_store(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("best.yaml", "results.json", "notes.txt"):
        (mine / name).write_text(f"my {name}")
    rc, _, err = bench_here([*argv, "--out", "mine"], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "not writing into it" in err and MARKER in err, err[-3000:]
    assert {p.name: p.read_text() for p in mine.iterdir()} == {n: f"my {n}" for n in
                                                              ("best.yaml", "results.json", "notes.txt")}
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / ".pobench").exists()


def test_bench_eval_writes_into_a_new_out_folder_and_again_into_its_own(tmp_path, bench_here):
    argv = ["eval", "--benchmarks", "arith", "--limit", "2", "--max-new-tokens", "4", "--no-mlflow", "--out", "o"]
    for _ in range(2):  # the second time into the folder it marked: allowed, its own files replaced
        rc, _, err = bench_here(argv, tmp_path)
        assert rc == 0, err[-3000:]
        assert (tmp_path / "o" / MARKER).is_file() and (tmp_path / "o" / "results.json").is_file()



def test_two_bench_evals_in_the_same_second_keep_both_results(tmp_path, bench_here, monkeypatch):
    """Held-out round 8 (F7): two `bench eval` without --out started in the same second both wrote
    `.pobench/eval/<time>/results.json`, and only the second one's results remained. Now each gets its own folder
    (`<time>`, then `<time>-2`), and each says where it wrote."""
    import types

    import bench.cli.eval as cli_eval

    monkeypatch.setattr(cli_eval, "time", types.SimpleNamespace(strftime=lambda fmt: "20261206-230925"))
    wrote = []
    for limit in ("2", "3"):
        rc, out, err = bench_here(["eval", "--benchmarks", "arith", "--limit", limit, "--max-new-tokens", "4",
                                   "--no-mlflow"], tmp_path)
        assert rc == 0, err[-3000:]
        wrote.append(next(line for line in out.splitlines() if line.startswith("bench eval: wrote")))
    first, second = tmp_path / ".pobench/eval/20261206-230925", tmp_path / ".pobench/eval/20261206-230925-2"
    assert str(first.relative_to(tmp_path)) in wrote[0] and str(second.relative_to(tmp_path)) in wrote[1]
    assert json.loads((first / "results.json").read_text())["limit"] == 2
    assert json.loads((second / "results.json").read_text())["limit"] == 3
    assert (first / MARKER).is_file() and (second / MARKER).is_file()

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


def test_bench_eval_out_naming_a_file_is_refused_before_any_work(tmp_path, bench_here):
    """Held-out round 3: `bench eval --out afile` loaded the model, evaluated, then stopped (exit 1) on the file."""
    (tmp_path / "afile").write_text("mine\n")
    rc, _, err = bench_here(["eval", "--benchmarks", "arith", "--limit", "2", "--max-new-tokens", "4", "--no-mlflow",
                             "--out", "afile"], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "--out afile: not a folder" in err, err[-3000:]
    assert (tmp_path / "afile").read_text() == "mine\n" and not (tmp_path / ".pobench").exists()


@pytest.mark.parametrize("study", ["  ", "s" * 513])
def test_a_study_name_that_cannot_be_stored_is_refused_before_the_study(tmp_path, bench_here, study):
    """Held-out round 3: `bench tune --study "  "` ran the study (a trial, three MLflow runs, the Optuna study
    written) and was refused only when writing its outputs."""
    rc, _, err = bench_here(["tune", "--algo", "grpo", "--trials", "1", "--steps", "2", "--study", study], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "--study" in err, err[-3000:]
    assert list(tmp_path.iterdir()) == []


def test_a_store_another_process_keeps_locked_is_one_line(tmp_path, bench_here, monkeypatch):
    """Held-out round 3: a store held by another process's `BEGIN EXCLUSIVE` (an open sqlite3 shell) ended `bench
    report` / `bench run` with a 90-line "database is locked" traceback. Now: waited for, then one line; and the
    same error met later in a command's work (MLflow's own, through SQLAlchemy) is described the same way."""
    import sqlite3
    import threading

    import sqlalchemy

    from bench import faults

    uri = fresh_store(tmp_path)
    db = tmp_path / "mlflow.db"
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        engine = sqlalchemy.create_engine(f"sqlite:///{db}", connect_args={"timeout": 0.1})
        with pytest.raises(sqlalchemy.exc.OperationalError) as raised:
            with engine.connect() as con:
                con.execute(sqlalchemy.text("select count(*) from experiments"))
        line = faults.describe(raised.value, store=uri)
        assert line == f"the MLflow store {uri} {faults.LOCKED}", line
        assert faults.describe(raised.value, storage="sqlite:///o.db") is not None
        t0 = time.monotonic()
        rc, _, err = bench_here(["report"], tmp_path)
        assert rc == 2 and len(_lines(err)) == 1 and "Traceback" not in err, err[-3000:]
        assert f"the MLflow store {db} stayed locked by another process" in err and time.monotonic() - t0 < 120, err
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    done = threading.Event()  # held for a moment only (another pobench's write): waited for, then the command works
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    threading.Timer(3.0, lambda: (holder.execute("ROLLBACK"), holder.close(), done.set())).start()
    rc, _, err = bench_here(["report"], tmp_path)
    assert done.is_set() and rc == 2 and "no MLflow experiment named 'pobench'" in err, err[-3000:]


@pytest.mark.parametrize("argv", [["train", "--steps", "1"], ["run", "--algos", "grpo", "--seeds", "0"], ["report"]])
def test_a_file_where_the_store_keeps_its_runs_files_is_refused_before_any_work(tmp_path, bench_here, argv):
    """Held-out round 3: a file named `mlartifacts` beside the store (where its runs' files go) was met at the first
    artifact: one line, but the comparison run stayed RUNNING until a rerun. Now refused before any work."""
    fresh_store(tmp_path)
    (tmp_path / "mlartifacts").write_text("mine\n")
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and f"{tmp_path / 'mlartifacts'} is not a folder" in err, err[-3000:]
    assert (tmp_path / "mlartifacts").read_text() == "mine\n" and not (tmp_path / ".pobench").exists()
    assert statuses(f"sqlite:///{tmp_path}/mlflow.db", "Default") == []


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


def test_a_symlink_loop_where_the_run_folder_goes_is_one_line(tmp_path, bench_here):
    """Held-out round 4: a symlink to itself at the run folder's path ended `bench train` in a RuntimeError traceback
    (Path.resolve's 'Symlink loop')."""
    fresh_store(tmp_path)
    rc, _, err = bench_here(["train", "--run-name", "r", *TINY], tmp_path)
    assert rc == 0, err[-3000:]
    loop = tmp_path / ".pobench" / "runs" / "pobench" / "loop"
    loop.symlink_to("loop")
    rc, _, err = bench_here(["train", "--run-name", "loop", *TINY], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "a symlink that leads back to itself" in err, err[-3000:]
    assert loop.is_symlink() and os.readlink(loop) == "loop"


@pytest.mark.parametrize("uri", ["sqlite:///", "sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_store_is_refused(tmp_path, bench_here, uri):
    """Held-out round 4: MLFLOW_TRACKING_URI=sqlite:/// trained, exit 0, and the run's record was gone with the
    process."""
    rc, _, err = bench_here(["train", *TINY], tmp_path, MLFLOW_TRACKING_URI=uri)
    assert rc == 2 and len(_lines(err)) == 1 and "an in-memory SQLite store, which keeps nothing" in err, err
    assert not (tmp_path / ".pobench").exists()


def test_resuming_a_run_the_store_does_not_hold_is_one_line(tmp_path, bench_here):
    """Held-out round 4: `--resume` after the store was moved away ended in MlflowException's traceback ('Run with
    id=... not found')."""
    argv = ["train", "--run-name", "r", *TINY]
    rc, _, err = bench_here(argv, tmp_path, MLFLOW_TRACKING_URI=fresh_store(tmp_path / "a"))
    assert rc == 0, err[-3000:]
    other = fresh_store(tmp_path / "b")  # (a store without the run: another one, or this one moved away)
    rc, _, err = bench_here([*argv, "--steps", "2", "--resume"], tmp_path, MLFLOW_TRACKING_URI=other)
    lines = [ln for ln in _lines(err) if "mlflow.store.db.utils" not in ln]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "which the store sqlite:///" in lines[0] and "does not hold" in lines[0] and "--force" in lines[0], lines


@pytest.mark.parametrize("flags", [["--temperature=nan"], ["--temperature=-1"], ["--temperature=inf"],
                                   ["--top-p=0"], ["--temperature=0", "--k", "2"]])
def test_bench_eval_refuses_a_sampling_setting_it_cannot_use(tmp_path, bench_here, flags):
    """Held-out round 4: `bench eval --temperature nan --k 2` exited 0 without the pass@k asked for and wrote NaN
    into results.json; -1 did the same; inf sampled at an infinite temperature."""
    rc, _, err = bench_here(["eval", "--benchmarks", "arith", "--limit", "2", "--max-new-tokens", "4", "--no-mlflow",
                             "--out", "ev", *flags], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1, err[-3000:]
    assert not (tmp_path / "ev").exists()


def test_tune_show_without_a_storage_creates_none(tmp_path, bench_here):
    """Held-out round 4 (a note): `bench tune --show --study nope` in an empty folder left an empty Optuna storage."""
    rc, _, err = bench_here(["tune", "--algo", "grpo", "--show", "--study", "nope"], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "no Optuna storage at" in err, err[-3000:]
    assert list(tmp_path.iterdir()) == []


def test_a_run_folder_deleted_while_training_fails_the_run_in_one_line_and_the_rerun_trains_it(tmp_path, bench_here):
    """Held-out round 5: `.pobench` deleted while `bench train` trained: the loop recreated `ckpt-*` and `final` in
    a folder without the marker, `run.json` or `config.yaml`; the plain rerun then said "pass --resume" and
    `--resume` said "not a pobench run folder": a dead end. Now the next checkpoint is refused in one line (the run
    ends FAILED), nothing is recreated, and the same command trains the run again; a folder left without its marker
    gets the same line from the rerun and from --resume."""
    import shutil
    import sys

    uri = fresh_store(tmp_path)
    def argv(steps: int) -> list[str]:
        return ["train", "--run-name", "r", "--tracking-uri", uri, "--steps", str(steps), *TINY[2:]]

    p = Proc([sys.executable, "-m", "bench.cli", *argv(400)], tmp_path)
    p.wait_for(lambda: checkpointed(tmp_path / ".pobench" / "runs" / "pobench"), "a checkpoint")
    shutil.rmtree(tmp_path / ".pobench")
    assert p.finish() == 2, p.text()
    assert not (tmp_path / ".pobench").exists(), sorted(map(str, (tmp_path / ".pobench").rglob("*")))
    lines = [ln for ln in p.lines() if not ln.startswith("bench: warning")]
    assert len(lines) == 1 and "was deleted, or its .pobench-owned marker removed, while the run trained" in lines[0]
    assert statuses(uri, "pobench") == ["FAILED"]
    run = tmp_path / ".pobench" / "runs" / "pobench" / "r"  # its marker alone gone: one line, --resume or not
    rc, out, err = bench_here(argv(2), tmp_path)
    assert rc == 0 and statuses(uri, "pobench") == ["FAILED", "FINISHED"], err[-3000:]
    (run / MARKER).unlink()
    for extra in ([], ["--resume"]):
        rc, out, err = bench_here([*argv(2), *extra], tmp_path)
        assert rc == 2 and "is not a pobench run folder" in err and "move it away" in err, err[-3000:]


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
