"""Held-out round 8's faults, each as the user met it (/work/r8-report.md: F2, F3, F11, F12, F13):

- a tag under pobench's or MLflow's own prefixes (``pobench.objective``, ``mlflow.runName``) is refused before any work
  (it mislabelled the run, or was MLflow's traceback);
- a tag MLflow cannot store is refused before any work (MLflow's traceback, the run left RUNNING);
- a ``--prompts-per-step`` no machine can hold is refused before any work (minutes and gigabytes, then nothing);
- ``bench warmstart`` into a folder holding another recipe's model is refused unless ``--force`` (it was replaced);
- a full disk names the file being written (it said "while writing a file").
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bench import faults
from tests import launch

TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--eval-every", "0", "--no-progress"]


def _bench(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return launch.run([sys.executable, "-m", "bench.cli", *argv], cwd=cwd, env=env, capture_output=True,
                      text=True, timeout=timeout)


def _nothing_made(folder: Path) -> None:
    assert not (folder / "mlflow.db").exists() and not (folder / ".pobench").exists() \
        and not (folder / "mlartifacts").exists(), sorted(p.name for p in folder.iterdir())


# ------------------------------------------------------------------ F2, F3: tags
@pytest.mark.parametrize("tags, said", [
    ("{pobench.objective: dapo, pobench.config_hash: abc}", "'pobench.objective': names under pobench. and mlflow."),
    ('{"bad key!?*<>": 1}', "'bad key!?*<>': MLflow cannot store it: Names may only contain"),
], ids=["reserved", "mlflow-refuses"])
def test_a_tag_pobench_or_mlflow_cannot_take_is_one_line_before_any_work(tmp_path, tags, said):
    p = _bench(["train", *TINY, "--tags", tags], tmp_path)
    assert p.returncode == 2, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench train: error: config field `tags` (--tags): tag "), p.stderr
    assert said in lines[0] and "rename the tag" in lines[0]
    _nothing_made(tmp_path)


@pytest.mark.parametrize("argv", [
    ["run", "--algos", "grpo,dapo", "--seeds", "0", "--no-controls", "--tags", '{pobench.seed: "7"}'],
    ["train", "--tags", "{mlflow.runName: zzz}"],
    ["train", "--tags", "{Pobench.Objective: x}"],
    ["tune", "--algo", "grpo", "--trials", "1", "--config", "c.yaml"],
    ["run", "--algos", "grpo", "--seeds", "0", "--config", "c.yaml"],
    ["train", "--tags", "{a/../b: 1}"],
    ["train", "--tags", "{note: " + "x" * 6001 + "}"],
], ids=["run", "mlflow-runName", "case", "tune-config", "run-config", "path", "long-value"])
def test_every_command_taking_tags_refuses_them_before_any_work(tmp_path, bench_here, argv):
    (tmp_path / "c.yaml").write_text("tags:\n  pobench.objective: tepo\n")
    rc, _, err = bench_here([*argv, *TINY[:-1]], tmp_path)
    assert rc == 2, err[-3000:]
    lines = [ln for ln in err.strip().splitlines() if " INFO " not in ln]
    assert len(lines) == 1 and "config field `tags` (--tags): tag " in lines[0], err
    _nothing_made(tmp_path)


def test_tags_of_pobench_itself_are_still_written_to_its_runs():
    """The check is on the user's tags (``TrainConfig.from_dict``): pobench's copies of a config (a pair's, a trial's)
    carry ``pobench.*`` / ``mlflow.parentRunId`` tags and still validate."""
    from bench.config import TrainConfig

    cfg = TrainConfig.from_dict({"tags": {"team": "rl", "ticket:id": 7}})
    replace(cfg, tags={**cfg.tags, "mlflow.parentRunId": "0" * 32, "pobench.comparison.c1": "1"}).validate()


# ------------------------------------------------------------------ F11: --prompts-per-step
def test_a_step_no_machine_can_hold_is_refused_before_any_work(tmp_path):
    p = _bench(["train", *TINY, "--prompts-per-step", "100000000000"], tmp_path, timeout=40)
    assert p.returncode == 2, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "config field `prompts_per_step`=100000000000" in lines[0], p.stderr
    assert "memory" in lines[0] and "give a smaller --prompts-per-step" in lines[0]
    _nothing_made(tmp_path)


def test_a_train_stopped_before_its_run_existed_does_not_speak_of_a_run(tmp_path):
    from bench.cli.train import stopped
    from bench.config import TrainConfig

    cfg = TrainConfig(output_dir=str(tmp_path / "runs"))
    line = str(stopped(cfg))
    assert "stopped before the run started" in line and "restarts from step 0" not in line, line
    cfg.run_dir().mkdir(parents=True)
    (cfg.run_dir() / "run.json").write_text("{}")  # its MLflow run was opened: it restarts from step 0
    assert "restarts from step 0" in str(stopped(cfg))


# ------------------------------------------------------------------ F12: bench warmstart
def test_warmstart_refuses_another_recipes_model_in_its_folder_unless_force(tmp_path, bench_here):
    from bench.warmstart import warmstart
    from tests.bench.test_warmstart import TINY as RECIPE

    out = warmstart(tmp_path / "m", RECIPE, progress=False)
    weights = (out / "model.safetensors").read_bytes()
    rc, _, err = bench_here(["warmstart", "--out", "m", "--steps", "3", "--eval", "0", "--no-progress"], tmp_path)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--out m: holds the warm-started model of another recipe" in lines[0], err
    assert "steps: 2 there, 3 here" in lines[0] and "pass --force" in lines[0]
    assert (out / "model.safetensors").read_bytes() == weights  # nothing replaced
    warmstart(out, replace(RECIPE, steps=3), force=True, progress=False)
    assert (out / "model.safetensors").read_bytes() != weights


# ------------------------------------------------------------------ F13: a full disk names the file
def test_a_full_disk_names_the_file_being_written():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with pytest.raises(OSError) as caught:
        Path("/dev/full").write_text("x" * 100_000)  # ENOSPC from the write: the error names no file
    assert caught.value.errno == errno.ENOSPC and caught.value.filename is None
    assert faults.describe(caught.value) == ("no space left on device while writing /dev/full (No space left on "
                                             "device): free space")


def test_a_full_disk_under_the_store_names_the_store(tmp_path):
    """SQLite's "database or disk is full" (MLflow's traceback, met opening the run) names the store's file."""
    import sqlite3

    from mlflow.exceptions import MlflowException

    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as e:
            raise MlflowException(f"(sqlite3.OperationalError) {e}") from e
    except MlflowException as e:
        line = faults.describe(e, store=f"sqlite:///{tmp_path}/mlflow.db")
    assert line == f"no space left on device while writing {tmp_path}/mlflow.db (SQLite: database or disk is full): " \
                   "free space"


# ------------------------------------------------------------------ smaller message problems of round 8
@pytest.mark.parametrize("argv, line", [
    (["compare", "c4e36f28ec4", "c4e36f28ec4"], "bench compare: error: a comparison is named twice; name each once"),
    (["eval", "--benchmarks", "arith", "--k", "0", "--no-mlflow"],
     "bench eval: error: --k 0: need k >= 1 and samples >= k"),
    (["eval", "--benchmarks", "arith", "--limit", "0", "--no-mlflow"],
     "bench eval: error: --limit 0: must be >= 1 (leave it out to evaluate every problem)"),
    (["tune", "--algo", "grpo", "--trials", "1", "--space", "kl_coef=a|b"],
     "bench tune: error: --space kl_coef: 'a' is not a number, and kl_coef of 'grpo' is a number field: give numbers"),
    (["eval", "--benchmarks", "arith,gsm8k,arith", "--no-mlflow"],
     "bench eval: error: --benchmarks: arith given twice; give each once"),
], ids=["compare-twice", "eval-k0", "eval-limit0", "tune-space-text", "eval-benchmark-twice"])
def test_small_messages_of_round_8_are_one_plain_line(tmp_path, bench_here, argv, line):
    from tests.conftest import fresh_store

    if argv[0] == "compare":  # (it reads a store)
        fresh_store(tmp_path / "store")
        argv = [*argv, "--tracking-uri", f"sqlite:///{tmp_path}/store/mlflow.db"]
    rc, _, err = bench_here(argv, tmp_path)
    lines = [ln for ln in err.strip().splitlines() if " INFO " not in ln]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(line), err
    assert "None" not in lines[0] and "not supported between" not in lines[0]
    _nothing_made(tmp_path)


def test_mlflows_artifact_folder_as_report_root_is_not_advised_away(tmp_path):
    from reports.paths import UnsafePath
    from reports.report import report_folder

    (tmp_path / "mlartifacts" / "pobench" / ("a" * 32) / "artifacts").mkdir(parents=True)
    with pytest.raises(UnsafePath) as refused:
        report_folder(tmp_path / "mlartifacts", "pobench")
    assert "is MLflow's artifact folder" in str(refused.value) and "move it away" not in str(refused.value)
    (tmp_path / "mine" / "pobench").mkdir(parents=True)  # a user's folder: still told to move it away
    with pytest.raises(UnsafePath, match="move it away"):
        report_folder(tmp_path / "mine", "pobench")
