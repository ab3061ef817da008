"""Issue 29's held-out round of faults, each as a user meets it (real files, a real SQLite store, real processes):

- `bench run --force` deletes only what pobench wrote in its own run folder: a user's analysis beside the checkpoints
  stays (and so does a file put inside ``final`` or a checkpoint);
- a pair that fails inside `bench run` (a plugin's advantage estimator returning NaN, in one process or two) is one
  line naming the pair and the cause, no traceback, no "(run None)";
- an experiment name MLflow cannot store is refused before any work, in one line;
- a SIGKILLed `bench run` does not leave its pool processes alive, nor their runs RUNNING;
- the comparison's MLflow run is FINISHED only once its report is written;
- `bench report` in a folder without a store says so and creates none;
- and later rounds' faults of files, stores and flags. `bench tune`'s are in test_tune_faults.py; runs left by a
  killed process or deleted in MLflow in test_run_recovery.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
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

def test_bench_eval_out_naming_a_file_is_refused_before_any_work(tmp_path, bench_here):
    """Held-out round 3: `bench eval --out afile` loaded the model, evaluated, then stopped (exit 1) on the file."""
    (tmp_path / "afile").write_text("mine\n")
    rc, _, err = bench_here(["eval", "--benchmarks", "arith", "--limit", "2", "--max-new-tokens", "4", "--no-mlflow",
                             "--out", "afile"], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and "--out afile: not a folder" in err, err[-3000:]
    assert (tmp_path / "afile").read_text() == "mine\n" and not (tmp_path / ".pobench").exists()


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
    assert "which the store sqlite:///" in lines[0] and "does not hold" in lines[0], lines
    # (held-out round 14, H10: it advised `--force`, which `bench train` has not; now the command that trains it again)
    # (the command is the one bench_here gave to main, not this process's sys.argv: under pytest-xdist it was empty)
    assert "--force" not in lines[0], lines
    assert lines[0].endswith("/r away, then rerun: " + shlex.join(["bench", *argv, "--steps", "2"])), lines


@pytest.mark.parametrize("flags", [["--temperature=nan"], ["--temperature=-1"], ["--temperature=inf"],
                                   ["--top-p=0"], ["--temperature=0", "--k", "2"]])
def test_bench_eval_refuses_a_sampling_setting_it_cannot_use(tmp_path, bench_here, flags):
    """Held-out round 4: `bench eval --temperature nan --k 2` exited 0 without the pass@k asked for and wrote NaN
    into results.json; -1 did the same; inf sampled at an infinite temperature."""
    rc, _, err = bench_here(["eval", "--benchmarks", "arith", "--limit", "2", "--max-new-tokens", "4", "--no-mlflow",
                             "--out", "ev", *flags], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1, err[-3000:]
    assert not (tmp_path / "ev").exists()
