"""Safe resume (bench/runs/resume.py): `bench train --resume` continues a run only under its own configuration (a larger
--steps is the one change, recorded); each experiment and configuration has its own `bench train` folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from bench.cli import main
from bench.runs import identity
from reports import metric_keys as K
from tests.conftest import fresh_store

TINY = ["--prompts-per-step", "2", "--group-size", "2", "--minibatches", "1", "--max-new-tokens", "8",
        "--eval-problems", "4", "--eval-every", "1", "--samples-every", "0", "--checkpoint-every", "1"]


@pytest.fixture
def bench_train(tmp_path, monkeypatch):
    monkeypatch.setenv(identity.CACHE_ENV, str(tmp_path / "cache"))
    uri = fresh_store(tmp_path)

    def run(*args: str) -> int:
        return main(["train", *TINY, "--tracking-uri", uri, "--output-dir", str(tmp_path / "runs"), *args])

    run.uri = uri
    return run


def run_folders(folder: Path) -> list[Path]:
    """The run folders of an output folder (not ``.locks``, the run folders' locks)."""
    return [p for p in folder.iterdir() if p.name != ".locks"]


def experiments(uri: str) -> set[str]:
    return {e.name for e in MlflowClient(uri).search_experiments()}


def test_resume_with_another_configuration_is_refused_naming_each_field(bench_train, tmp_path, capsys):
    assert bench_train("--algo", "grpo", "--control", "random-reward", "--steps", "1", "--experiment", "ctl") == 0
    (folder,) = run_folders(tmp_path / "runs" / "ctl")
    assert folder.name.startswith("grpo-s0-")
    store = Path(bench_train.uri.removeprefix("sqlite:///")).read_bytes()
    capsys.readouterr()

    assert bench_train("--algo", "grpo", "--steps", "2", "--experiment", "other", "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "control ('random-reward' -> None)" in err and "experiment ('ctl' -> 'other')" in err
    assert "steps" not in err.split("another configuration:")[1].split(".")[0]  # a larger --steps may change
    assert not (tmp_path / "runs" / "other").exists() and "other" not in experiments(bench_train.uri)
    assert Path(bench_train.uri.removeprefix("sqlite:///")).read_bytes() == store  # nothing written

    assert bench_train("--algo", "grpo", "--control", "random-reward", "--steps", "1", "--experiment", "ctl",
                       "--max-new-tokens", "4", "--lr", "1e-3", "--resume") == 2
    err = capsys.readouterr().err
    assert "max_new_tokens (8 -> 4)" in err and "lr (3e-05 -> 0.001)" in err


def test_fewer_steps_refused_larger_steps_resume_and_are_recorded(bench_train, tmp_path, capsys):
    common = ["--algo", "grpo", "--experiment", "ext"]
    assert bench_train(*common, "--steps", "2") == 0
    (folder,) = run_folders(tmp_path / "runs" / "ext")
    capsys.readouterr()
    assert bench_train(*common, "--steps", "1", "--resume") == 2
    assert "steps (2 -> 1)" in capsys.readouterr().err
    assert bench_train(*common, "--steps", "2", "--lr-schedule", "cosine", "--resume") == 2
    assert bench_train(*common, "--steps", "3", "--resume") == 0
    client = MlflowClient(bench_train.uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ext").experiment_id])
    assert run.data.tags["pobench.steps_extended"] == "2,3"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/reward_mean")] == [1, 2, 3]
    assert yaml.safe_load((folder / "config.yaml").read_text())["steps"] == 3


def test_cpu_seconds_are_logged_increasing_and_continued_by_a_resume(bench_train, tmp_path):
    """time/cpu_s (the load-independent cost axis): logged at every step, increasing, kept in the checkpoint, and
    continued from the checkpoint's count by a resume (not restarted from 0); the machine's load is logged beside."""
    common = ["--algo", "grpo", "--experiment", "cpu"]
    assert bench_train(*common, "--steps", "2") == 0
    (folder,) = run_folders(tmp_path / "runs" / "cpu")
    client = MlflowClient(bench_train.uri)
    (run,) = client.search_runs([client.get_experiment_by_name("cpu").experiment_id])

    def series(key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))

    cpu = series(K.CPU_S)
    assert [s for s, _ in cpu] == [1, 2] and 0 < cpu[0][1] < cpu[1][1]
    state_file = folder / "ckpt-0000002" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["cpu_s"] == pytest.approx(cpu[1][1])
    # a count the checkpoint holds and no restarted one can reach: the resumed step must continue from it
    state["cpu_s"] = 1000.0
    state_file.write_text(json.dumps(state))
    assert bench_train(*common, "--steps", "3", "--resume") == 0
    resumed = series(K.CPU_S)
    assert [s for s, _ in resumed] == [1, 2, 3] and resumed[:2] == cpu
    assert 1000.0 < resumed[2][1] < 1000.0 + 10 * cpu[1][1]   # one more step's CPU time on top of the checkpoint's
    load = series(K.LOAD_AVG_1M)
    assert [s for s, _ in load] == [1, 2, 3] and all(v >= 0 for _, v in load)


def test_rewritten_data_is_named_on_resume(bench_train, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?", "answer": "#### 4"}\n')
    common = ["--algo", "grpo", "--experiment", "d", "--task", "gsm8k", "--data", str(data), "--eval-task", "arith",
              "--steps", "1", "--run-name", "mine"]
    assert bench_train(*common) == 0
    data.write_text('{"question": "1+1?", "answer": "#### 3"}\n{"question": "2+2?", "answer": "#### 5"}\n')
    capsys.readouterr()
    assert bench_train(*common, "--steps", "2", "--resume") == 2
    assert "inputs.train_data" in capsys.readouterr().err


def test_two_configurations_get_two_folders(bench_train, tmp_path):
    assert bench_train("--algo", "grpo", "--steps", "1", "--experiment", "two") == 0
    assert bench_train("--algo", "grpo", "--steps", "1", "--experiment", "two", "--control", "random-reward") == 0
    assert len(run_folders(tmp_path / "runs" / "two")) == 2


def test_every_engine_refuses_another_configuration_on_resume(tmp_path, monkeypatch):
    """The lifecycle's run_folder (every engine, `bench run`'s pairs) checks too, not only `bench train`'s command."""
    import dataclasses

    from bench.config import TrainConfig

    from .fake_trainer import fake_train

    monkeypatch.setenv(identity.CACHE_ENV, str(tmp_path / "cache"))
    cfg = TrainConfig(steps=2, eval_every=1, checkpoint_every=1, samples_every=0, run_name="r",
                      output_dir=str(tmp_path / "runs"), tracking_uri=fresh_store(tmp_path))
    fake_train(cfg)
    with pytest.raises(ValueError, match=r"another configuration: lr \(3e-05 -> 0\.001\)\."):
        fake_train(dataclasses.replace(cfg, lr=1e-3, steps=3, resume=True))
    assert fake_train(dataclasses.replace(cfg, steps=3, resume=True)).steps_done == 3
