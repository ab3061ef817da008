"""Held-out round 9's bad inputs, each as the user met it (issue 29: H05-H07, H18, H33, H34, H39, H52, H53, H58b):

- a ``--prompt-template`` without ``{question}`` is refused with the flags, before any run, pair or trial;
- a folder or a pipe named as a plugin or as data is named for what it is (it was "no such file");
- a folder name longer than the file system takes is one line (an OSError traceback);
- ``bench eval --max-new-tokens 0`` / ``--batch-size 0`` are refused (read as "not given");
- a plugin raising KeyboardInterrupt with no signal is its fault, not a stop; a plugin closing sys.stdout is refused;
- skipped bad rows are said once per file and split.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import launch
from tests.bench.test_signals import statuses

TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--eval-every", "0",
        "--samples-every", "0"]


def _bench(argv: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """`python -m bench ARGV` in ``cwd`` (the user's spelling of the command), no MLFLOW_* variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return launch.run([sys.executable, "-m", "bench", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                      timeout=timeout)


def _nothing_made(folder: Path) -> None:
    made = {p.name for p in folder.iterdir()} & {"mlflow.db", ".pobench", "mlartifacts", "reports"}
    assert not made, sorted(made)


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


# ------------------------------------------------------------------ H05-H07: --prompt-template
@pytest.mark.parametrize("command", [
    ["train", *TINY, "--no-progress"],
    ["run", *TINY, "--no-progress", "--algos", "grpo", "--seeds", "0", "--workers", "1", "--no-report"],
    ["tune", *TINY[:-4], "--eval-every", "1", "--algo", "grpo", "--trials", "1", "--workers", "1"],
    ["eval", "--benchmarks", "arith", "--limit", "2", "--no-mlflow", "--out", "e"],
], ids=["train", "run", "tune", "eval"])
@pytest.mark.parametrize("template", ["{nope}", "no placeholder"])
def test_a_prompt_template_without_question_is_refused_before_any_work(tmp_path, bench_here, command, template):
    """H05-H07: train made a FAILED run and its folder, run a FAILED comparison and pair ("pair failed", exit 1),
    tune an Optuna traceback and a FAIL trial per call. Now one line with the flags, exit 2, nothing made."""
    rc, _, err = bench_here([*command, "--prompt-template", template], tmp_path)
    assert rc == 2, err[-3000:]
    assert "must be auto, chat, plain, or a format string holding {question}" in _one_line(err)
    _nothing_made(tmp_path)
    assert not (tmp_path / "e").exists()


def test_a_notebooks_comparison_with_a_bad_template_is_refused_before_any_run(tmp_path, monkeypatch):
    """The library's entry (a notebook) makes the same check before any record."""
    from bench.comparison.runner import ComparisonSpec, run_comparison
    from bench.config import TrainConfig
    from tests.conftest import fresh_store

    monkeypatch.chdir(tmp_path)
    uri = fresh_store(tmp_path)
    cfg = TrainConfig(prompt_template="{nope}", tracking_uri=uri, steps=1, prompts_per_step=2, group_size=2,
                      eval_every=0, samples_every=0)
    with pytest.raises(ValueError, match="prompt_template"):
        run_comparison(ComparisonSpec(cfg=cfg, algos=["grpo"], seeds=[0], workers=1, report=False))
    assert not (tmp_path / ".pobench").exists()
    from mlflow import MlflowClient

    assert MlflowClient(uri).search_runs([e.experiment_id for e in MlflowClient(uri).search_experiments()]) == []


# ------------------------------------------------------------------ H18, H33: folders and pipes
@pytest.mark.parametrize("kind", ["./dir", "abs-dir", "module-name", "fifo-plugin", "fifo-data"])
def test_a_folder_or_a_pipe_given_for_a_file_is_named_for_what_it_is(tmp_path, bench_here, monkeypatch, kind):
    """H18: a folder as --plugin said "no such file" (by path) or was imported silently as an empty namespace
    package (by name); H33: a FIFO as --data said "no such file or folder". Now each is named, exit 2."""
    (tmp_path / "myplugins_r9").mkdir()
    os.mkfifo(tmp_path / "p.fifo")
    monkeypatch.syspath_prepend(str(tmp_path))  # (as `python -m bench` has the working folder on sys.path)
    argv, said = {
        "./dir": (["--plugin", "./myplugins_r9"], "plugin ./myplugins_r9: is a folder; give a .py file or an "
                                                   "importable module name"),
        "abs-dir": (["--plugin", str(tmp_path / "myplugins_r9")], "is a folder; give a .py file or an importable "
                                                                  "module name"),
        "module-name": (["--plugin", "myplugins_r9"], "plugin myplugins_r9: is a folder; give a .py file or an "
                                                      "importable module name"),
        "fifo-plugin": (["--plugin", "./p.fifo"], "plugin ./p.fifo: not a regular file (a pipe or device)"),
        "fifo-data": (["--task", "gsm8k", "--data", "p.fifo"], "--data p.fifo: not a regular file (a pipe or "
                                                               "device)"),
    }[kind]
    try:
        rc, _, err = bench_here(["train", *argv, *TINY, "--no-progress"], tmp_path)
    finally:
        sys.modules.pop("myplugins_r9", None)
    assert rc == 2, err[-3000:]
    assert said in _one_line(err), err
    _nothing_made(tmp_path)


# ------------------------------------------------------------------ H34: a name too long for the file system
@pytest.mark.parametrize("argv, flag", [
    (["train", *TINY, "--no-progress", "--output-dir", "d" * 300], "--output-dir"),
    (["run", *TINY, "--no-progress", "--algos", "grpo", "--seeds", "0", "--out-root", "d" * 300], "--out-root"),
    (["eval", "--benchmarks", "arith", "--no-mlflow", "--out", "d" * 300], "--out"),
    (["warmstart", "--out", "d" * 300], "--out"),
], ids=["train", "run", "eval", "warmstart"])
def test_a_folder_name_longer_than_the_file_system_takes_is_one_line(tmp_path, bench_here, argv, flag):
    """H34: `bench train --output-dir <300 x d>` was an OSError [Errno 36] traceback, exit 1."""
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 2, err[-3000:]
    line = _one_line(err)
    assert flag in line and "is 300 bytes long, over the" in line and "dddddddd...dddddddd" in line, line
    _nothing_made(tmp_path)


def test_a_path_built_from_names_is_checked_by_the_same_helper(tmp_path):
    """--run-name / --experiment / --study become components through safe_component and contained(): a root whose
    join the file system cannot name is the same one line."""
    from reports.paths import UnsafePath, contained

    with pytest.raises(UnsafePath, match="is 300 bytes long"):
        contained(tmp_path, "x" * 300)
    assert contained(tmp_path, "x" * 96) == tmp_path / ("x" * 96)


# ------------------------------------------------------------------ H39: bench eval 0 counts
@pytest.mark.parametrize("flag, said", [("--max-new-tokens", "--max-new-tokens 0: must be >= 1"),
                                        ("--batch-size", "--batch-size 0: must be >= 1")])
def test_bench_eval_refuses_a_zero_count(tmp_path, bench_here, flag, said):
    """H39: 0 was read as "not given": --max-new-tokens 0 evaluated with 512 new tokens (and recorded 512),
    --batch-size 0 with the engine's default."""
    rc, _, err = bench_here(["eval", "--benchmarks", "arith", "--limit", "8", "--no-mlflow", flag, "0", "--out", "a"],
                            tmp_path)
    assert rc == 2 and said in _one_line(err), err
    assert not (tmp_path / "a").exists()


# ------------------------------------------------------------------ H52, H53: a plugin's interrupt, closed streams
def test_a_keyboardinterrupt_a_plugin_raises_is_its_fault_not_a_stop(tmp_path):
    """H52: a plugin loss raising KeyboardInterrupt (no signal sent) was "stopped by SIGINT ...; rerun", exit 130,
    the run KILLED. Now (no signal received) one line naming the plugin's line, exit 1, the run FAILED."""
    (tmp_path / "kbi.py").write_text(
        "from algorithms import register\nfrom algorithms.policy_gradient import PGConfig, PolicyGradient\n"
        "class K(PolicyGradient):\n    config_class = PGConfig\n"
        "    def policy_term(self, batch, ratio, adv, is_w):\n        raise KeyboardInterrupt('plugin bug')\n"
        "register('kbi', K, description='t')\n")
    p = _bench(["train", "--plugin", "kbi.py", "--algo", "kbi", *TINY, "--no-progress"], tmp_path)
    assert p.returncode == 1, p.stderr[-3000:]
    line = [ln for ln in p.stderr.splitlines() if "error" in ln or "stopped" in ln]
    assert line == [f"bench train: error: plugin kbi.py raised KeyboardInterrupt: plugin bug at {tmp_path}/kbi.py:6 "
                    "(in policy_term): fix the plugin (POBENCH_TRACEBACK=1 shows the traceback)"], p.stderr[-3000:]
    assert statuses(f"sqlite:///{tmp_path}/mlflow.db", "pobench", "train") == ["FAILED"]


def test_a_plugin_closing_stdout_at_import_is_refused_before_any_work(tmp_path):
    """H53: the run trained to FINISHED, then "I/O operation on closed file", exit 2, the plugin not named."""
    (tmp_path / "closeout.py").write_text("import sys\nfrom algorithms import register\nsys.stdout.close()\n"
                                          "register('grpo-co', base='grpo', description='t')\n")
    p = _bench(["train", "--plugin", "closeout.py", "--algo", "grpo-co", *TINY, "--no-progress"], tmp_path)
    assert p.returncode == 2, p.stderr[-3000:]
    assert _one_line(p.stderr) == ("bench train: error: plugin closeout.py closed sys.stdout while imported, where "
                                   "pobench writes its output and its errors: fix the plugin (leave the command's "
                                   "streams open)")
    _nothing_made(tmp_path)


# ------------------------------------------------------------------ H58b: skipped rows said once
def test_skipped_bad_rows_are_said_once_per_file_and_split(tmp_path, bench_here, caplog):
    """H58b: the same file as --data and --eval-data with --skip-bad-rows: "skipped 3 bad row(s)" six times (each
    file read for the inputs' check, their digests and the training). Now once for the training split, once for
    the held-out one."""
    (tmp_path / "rows.jsonl").write_text('{"question": "What is 1+1?", "answer": "#### 2"}\n[1, 2]\nnull\n42\n'
                                         '{"question": "What is 2+2?", "answer": "#### 4"}\n')
    caplog.set_level(logging.WARNING, logger="evaluators.benchmarks")
    rc, _, err = bench_here(["train", "--task", "gsm8k", "--data", "rows.jsonl", "--eval-data", "rows.jsonl",
                             "--skip-bad-rows", *TINY[:-4], "--eval-every", "1", "--samples-every", "0",
                             "--no-progress"], tmp_path)
    assert rc == 0, err[-3000:]
    said = [r.getMessage() for r in caplog.records if "skipped 3 bad row(s)" in r.getMessage()]
    assert [s.split(":")[0] for s in said] == ["gsm8k (train split)", "gsm8k (test split)"], said
