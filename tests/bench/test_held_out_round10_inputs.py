"""Held-out round 10's bad inputs and conflicting flags, each as the user met it (H02, H06, H08, H13, H16-H20):

- ``bench tune`` on an in-memory storage, or on another storage under the name of a study held elsewhere;
- ``bench train --comparison ID`` of a comparison trained under another configuration;
- a damaged ``config.yaml`` / ``inputs.json`` in the run folder ``--resume`` continues;
- a plugin's loss raising during training: exit 1 whatever the exception's class;
- ``bench tune --pruner-warmup -1`` / ``--max-retry -1``;
- ``bench eval``: flags that would be ignored (``--split`` with one file, ``--no-mlflow`` with an MLflow run's
  name or parent), and rows whose field is there but empty or no text;
- ``bench list`` with flags it would drop (``--details`` with ``--compare``, ``--params`` without it);
- ``--output-dir`` inside MLflow's artifact folder;
- ``--max-new-tokens`` past the built-in model's context with the generated task: warned as for a file task;
"""

from __future__ import annotations

import pytest

from tests.bench.test_signals import statuses
from tests.conftest import fresh_store


def _lines(err: str) -> list[str]:
    return [ln for ln in err.strip().splitlines() if ln.strip() and " INFO mlflow" not in ln]


def _tune(uri: str, *extra: str) -> list[str]:
    return ["tune", "--algo", "grpo", "--trials", "1", "--steps", "1", "--seeds", "0", "--tracking-uri", uri,
            "--experiment", "tx", "--eval-every", "1", "--samples-every", "0", "--sampler-seed", "0", "--workers", "1",
            *extra]


def test_a_study_of_the_same_name_in_another_storage_is_refused_before_any_work(tmp_path, bench_here,
                                                                                monkeypatch):
    """H02: after a study on the default storage, the same `bench tune` with `--storage sqlite:///` (in memory) or
    with a new SQLite file made a study run and a trial run, then trial 0 met the earlier trial's run folder: Optuna's
    traceback, advice naming --resume / --run-name (flags tune has not), exit 2, and the in-memory study's run left
    RUNNING. Now: one line, exit 2, before any storage file or MLflow run; the original study is still joined."""
    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    uri = fresh_store(tmp_path)
    rc, _, err = bench_here(_tune(uri), tmp_path)
    assert rc == 0, err[-3000:]
    before = statuses(uri, "tx")
    assert before == ["FINISHED"] * 3, before

    rc, _, err = bench_here(_tune(uri, "--storage", "sqlite:///"), tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "--storage sqlite:///: an in-memory Optuna storage is lost" in lines[0], lines

    other = tmp_path / "other.db"
    rc, _, err = bench_here(_tune(uri, "--storage", f"sqlite:///{other}"), tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "--study tune-grpo: the MLflow run" in lines[0] and "another Optuna storage" in lines[0], lines
    assert str(tmp_path / ".pobench/tune/optuna.db") in lines[0] and str(other) in lines[0], lines
    assert "--resume" not in lines[0] and "--run-name" not in lines[0] and "another --study" in lines[0], lines
    assert not other.exists()

    # another experiment (no MLflow run of the study there): the earlier trial's run folder is what collides
    rc, _, err = bench_here([*_tune(uri, "--storage", f"sqlite:///{other}"), "--experiment", "ty"], tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1, err[-3000:]
    assert "tune-grpo-t0-s0 holds trial 0's run of an earlier study" in lines[0], lines
    assert "another --output-dir" in lines[0], lines
    assert statuses(uri, "tx") == before  # no run made, none RUNNING

    rc, _, err = bench_here(_tune(uri), tmp_path)  # the study itself, on its storage: joined as before
    assert rc == 0, err[-3000:]


def test_bench_train_into_a_comparison_of_another_configuration_is_refused_and_its_report_kept(
        tmp_path, bench_here, monkeypatch):
    """H06: `bench train --algo tepo --comparison <id of a bench run comparison>` with other settings tagged its run
    into that comparison, whose report was then refused for good ("mixes runs with different configs"). Now: one
    line naming both configurations, exit 2, before any run; the comparison's report is still made."""
    from mlflow import MlflowClient

    from tests.bench import fake_trainer

    fake_trainer.inject(monkeypatch.setattr)
    uri = fresh_store(tmp_path)
    run = ["run", "--algos", "grpo", "--seeds", "0", "--no-controls", "--workers", "1", "--no-progress", "--no-report",
           "--tracking-uri", uri, "--experiment", "ex", "--steps", "2", "--prompts-per-step", "2", "--group-size", "2",
           "--eval-every", "1", "--eval-problems", "4", "--samples-every", "0"]
    rc, _, err = bench_here(run, tmp_path)
    assert rc == 0, err[-3000:]
    client = MlflowClient(uri)
    exp_id = client.get_experiment_by_name("ex").experiment_id
    (cid,) = {r.data.tags["pobench.comparison"] for r in client.search_runs([exp_id], "")}
    before = statuses(uri, "ex")

    rc, _, err = bench_here(["train", "--algo", "tepo", "--comparison", cid, "--tracking-uri", uri, "--experiment",
                             "ex", "--steps", "3", "--no-progress"], tmp_path)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert f"--comparison {cid}: the runs of that comparison" in lines[0], lines
    assert "another configuration" in lines[0] and "drop --comparison" in lines[0], lines
    assert statuses(uri, "ex") == before and not list((tmp_path / ".pobench/runs").rglob("tepo*"))

    rc, _, err = bench_here(["report", "--tracking-uri", uri, "--experiment", "ex", "--comparison", cid], tmp_path)
    assert rc == 0, err[-3000:]

    # a store the code before left so (a run of other settings tagged into the comparison): the report leaves it out
    # and says so, instead of refusing the comparison for good
    rc, _, err = bench_here([*run[:2], "dapo", *run[3:], "--steps", "3"], tmp_path)
    assert rc == 0, err[-3000:]
    (other,) = [r for r in client.search_runs([exp_id], "tags.`pobench.kind` = 'train'")
                if r.data.tags["pobench.comparison"] != cid]
    client.set_tag(other.info.run_id, "pobench.comparison", cid)
    rc, _, err = bench_here(["report", "--tracking-uri", uri, "--experiment", "ex", "--comparison", cid], tmp_path)
    assert rc == 0, err[-3000:]
    report = (tmp_path / "reports/out/ex" / cid / "report.md").read_text()
    assert f"Run {other.info.run_name} (dapo, seed 0) was trained under another configuration" in report


def test_a_damaged_config_or_inputs_file_on_resume_is_one_line_naming_it(tmp_path, bench_here):
    """H08: on `bench train --resume`, a config.yaml cut mid-way gave a YAML traceback, an empty one a 40-field
    "None -> ..." line, a cut inputs.json a JSON error naming no file. Now each is one line naming the file and what
    to do, exit 2, before any work."""
    uri = fresh_store(tmp_path)
    argv = ["train", "--algo", "grpo", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
            "--max-new-tokens", "8", "--eval-every", "0", "--samples-every", "0", "--checkpoint-every", "1",
            "--tracking-uri", uri, "--no-progress"]
    rc, _, err = bench_here(argv, tmp_path)
    assert rc == 0, err[-3000:]
    (run,) = (tmp_path / ".pobench/runs/pobench").glob("grpo-s0-*")
    config, inputs = run / "config.yaml", run / "inputs.json"
    good = config.read_text()
    resume = [*argv[:4], "2", *argv[5:], "--resume"]
    for damage, file, why in ((good[:300] + "\n: : [\n", config, "invalid YAML at line"), ("", config, "empty"),
                              (None, inputs, "invalid JSON")):
        config.write_text(good)
        if damage is None:
            inputs.write_text('{"data')
        else:
            file.write_text(damage)
        rc, _, err = bench_here(resume, tmp_path)
        lines = _lines(err)
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
        said = f"--resume: {file.relative_to(tmp_path)} is damaged ({why}"
        assert said in lines[0] and "restore it" in lines[0], lines
    assert statuses(uri, "pobench") == ["FINISHED"]


@pytest.mark.parametrize("error", ["ValueError", "FileNotFoundError", "RuntimeError"])
def test_a_plugin_raising_during_training_exits_1_whatever_the_class(tmp_path, bench_here, error):
    """H13: a plugin's policy_term raising ValueError or FileNotFoundError exited 2 ("bad input, before any work"),
    RuntimeError 1, though each run had started (and ended FAILED). Now each is exit 1 with the plugin's line."""
    name = f"r10-{error.lower()}"
    (tmp_path / "bad.py").write_text(
        "from algorithms import register\nfrom algorithms.policy_gradient import PGConfig, PolicyGradient\n"
        "class B(PolicyGradient):\n    config_class = PGConfig\n"
        f"    def policy_term(self, batch, ratio, adv, is_w):\n        raise {error}('plugin bug')\n"
        f"register({name!r}, B, description='t')\n")
    uri = fresh_store(tmp_path)
    rc, _, err = bench_here(["train", "--plugin", "bad.py", "--algo", name, "--steps", "1", "--prompts-per-step", "2",
                             "--group-size", "2", "--max-new-tokens", "8", "--eval-every", "0", "--samples-every",
                             "0", "--tracking-uri", uri, "--no-progress"], tmp_path)
    lines = [ln for ln in _lines(err) if "error" in ln or "stopped" in ln]
    assert rc == 1, err[-3000:]
    assert lines == [f"bench train: error: plugin bad.py raised {error}: plugin bug at {tmp_path}/bad.py:6 (in "
                     "policy_term): fix the plugin (POBENCH_TRACEBACK=1 shows the traceback)"], err[-3000:]
    assert statuses(uri, "pobench") == ["FAILED"]


def test_max_new_tokens_past_the_context_is_warned_for_a_generated_task(tmp_path, bench_here):
    """H16: `bench train --max-new-tokens 100000` (the built-in model's context: 256) with the generated arith task
    was accepted without the warning a file task gets (the check skipped generated tasks)."""
    uri = fresh_store(tmp_path)
    rc, _, err = bench_here(["train", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--eval-every",
                             "0", "--samples-every", "0", "--no-progress", "--max-new-tokens", "100000", "--run-name",
                             "mnt", "--eval-problems", "4", "--tracking-uri", uri], tmp_path)
    assert rc == 0, err[-3000:]
    warned = [ln for ln in _lines(err) if "warning" in ln]
    assert len(warned) == 2, err[-3000:]  # the training and the held-out side
    assert "--max-new-tokens 100000 is at least the model's context of 256 tokens: every training completion is cut"\
        in warned[0], warned


@pytest.mark.parametrize("flag", ["--pruner-warmup", "--pruner-startup", "--max-retry"])
def test_a_negative_pruner_or_retry_count_is_refused_naming_the_flag(tmp_path, bench_here, flag):
    """H17: `bench tune --pruner-warmup -1` was refused in Optuna's words ("n_warmup_steps=-1"), naming no flag;
    `--max-retry -1` was taken and the study trained. Now one line naming the flag, exit 2, nothing made."""
    rc, _, err = bench_here(_tune(f"sqlite:///{tmp_path}/mlflow.db", flag, "-1"), tmp_path)
    assert rc == 2 and _lines(err) == [f"bench tune: error: {flag} -1: must be >= 0"], err[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags, said", [
    (["--split", "nosuch"], "--split nosuch: --data one.jsonl is one file, read whole"),
    (["--parent-run-id", "abc"], "--no-mlflow records no MLflow run, so --parent-run-id would be ignored"),
    (["--run-name", "x"], "--no-mlflow records no MLflow run, so --run-name would be ignored"),
])
def test_bench_eval_refuses_flags_it_would_ignore(tmp_path, bench_here, flags, said):
    """H18: `bench eval --data one.jsonl --split nosuch` evaluated the file and recorded split "nosuch";
    `--no-mlflow --parent-run-id abc` / `--run-name x` were taken and ignored. Now one line, exit 2, nothing made."""
    (tmp_path / "one.jsonl").write_text('{"question": "What is 2+2?", "answer": "4"}\n')
    rc, _, err = bench_here(["eval", "--benchmarks", "gsm8k", "--data", "one.jsonl", "--no-mlflow", "--out", "o",
                             *flags], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and said in err, err[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.jsonl"]


@pytest.mark.parametrize("row, said", [
    ('{"question": "What is 2+2?", "answer": ""}', "no reference answer: field 'answer' is empty"),
    ('{"question": "", "answer": "4"}', "no question: field 'question' is empty"),
    ('{"question": ["x"], "answer": "4"}', "no question: field 'question' is a list, not text"),
    ('{"q": "What is 2+2?", "answer": "4"}', "no question: expected field 'question' or 'problem'"),
])
def test_a_row_with_an_empty_or_non_text_field_names_it(tmp_path, bench_here, row, said):
    """H18: rows whose 'answer' was "" or whose 'question' was "" or ["x"] said "expected field 'answer'; fields
    present: answer, question": the field is there, empty or no text. Now the line says which."""
    (tmp_path / "one.jsonl").write_text(row + "\n")
    rc, _, err = bench_here(["eval", "--benchmarks", "gsm8k", "--data", "one.jsonl", "--no-mlflow", "--out", "o"],
                            tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and said in err, err[-3000:]


@pytest.mark.parametrize("flags, said", [
    (["--details", "grpo", "--compare", "grpo"], "--details and --compare: one listing at a time"),
    (["--params", "/nonexistent"], "--params: only read with --compare NAMES"),
    (["--compare", ""], "--compare: no objective given"),
])
def test_bench_list_refuses_flags_it_would_drop(tmp_path, bench_here, flags, said):
    """H19: `bench list --details grpo --compare grpo` printed the details only; `--params /nonexistent` without
    --compare exited 0 (the file never read); `--compare ""` printed the plain list. Now one line each, exit 2."""
    rc, out, err = bench_here(["list", *flags], tmp_path)
    assert rc == 2 and len(_lines(err)) == 1 and f"bench list: error: {said}" in err, err
    assert out == ""


@pytest.mark.parametrize("command", ["train", "tune"])
def test_an_output_dir_inside_mlflows_artifact_folder_is_refused(tmp_path, bench_here, command):
    """H20: `bench train --output-dir mlartifacts` put its run folder and .locks among the runs' <run id>/ folders of
    MLflow's artifact folder (`bench report --out-root mlartifacts` is refused). Now one line, exit 2, before any
    run."""
    uri = fresh_store(tmp_path)
    (tmp_path / "mlartifacts").mkdir(exist_ok=True)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    argv = _tune(uri) if command == "tune" else ["train", "--algo", "grpo", "--steps", "1", "--tracking-uri", uri]
    for out in ("mlartifacts", "mlartifacts/runs"):
        rc, _, err = bench_here([*argv, "--output-dir", out], tmp_path)
        lines = _lines(err)
        assert rc == 2 and len(lines) == 1, err[-3000:]
        assert f"--output-dir {out}: inside MLflow's artifact folder {tmp_path / 'mlartifacts'}" in lines[0], lines
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
