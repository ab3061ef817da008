"""`bench tune --workers N [--executor ray]`: several workers split one study's trials through the Optuna storage,
each in its own process (or Ray task), with real training of the built-in model; bad combinations are refused."""

from __future__ import annotations

import dataclasses
import re
import uuid

import optuna
import pytest

from bench import tune
from bench.cli import main as cli_main
from tests.conftest import ON_RAY, fresh_store


def _argv(tmp_path, study: str, exp: str, uri: str, trials: int, *extra: str) -> list[str]:
    return ["tune", "--algo", "grpo", "--trials", str(trials), "--steps", "1", "--seeds", "0", "--study", study,
            "--storage", f"sqlite:///{tmp_path}/optuna.db", "--tracking-uri", uri, "--out", str(tmp_path / "out"),
            "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--eval-every", "1",
            "--max-new-tokens", "12", "--experiment", exp, "--output-dir", str(tmp_path / "runs"),
            "--samples-every", "0", "--sampler-seed", "0", *extra]


def _check_study(tmp_path, study: str, exp: str, uri: str, trials: int) -> set[str]:
    """The study holds its trials, finished, each with one MLflow trial run under one parent; returns the workers
    that ran them (the trials' ``worker`` attribute)."""
    from mlflow.tracking import MlflowClient

    s = optuna.load_study(study_name=study, storage=f"sqlite:///{tmp_path}/optuna.db")
    finished = [t for t in s.trials if t.state in tune.FINISHED]
    assert trials <= len(finished) <= trials + 1  # a worker may start one trial before it sees the quota reached
    client = MlflowClient(uri)
    eid = client.get_experiment_by_name(exp).experiment_id
    parents = client.search_runs([eid], "tags.`pobench.kind` = 'tune-study'")
    trial_runs = client.search_runs([eid], "tags.`pobench.kind` = 'tune-trial'")
    assert len(parents) == 1
    assert sorted(int(r.data.tags["pobench.trial"]) for r in trial_runs) == sorted(t.number for t in s.trials)
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in trial_runs)
    # two workers with sampler seeds 0 and 1 do not propose the same parameters
    assert len({tuple(sorted(t.params.items())) for t in finished}) == len(finished)
    return {t.user_attrs.get("worker") for t in finished}


@pytest.mark.slow
def test_two_local_workers_split_the_trials(tmp_path, capfd):
    study, exp, uri = f"w-{uuid.uuid4().hex[:6]}", "workers", fresh_store(tmp_path)
    assert cli_main(_argv(tmp_path, study, exp, uri, 4, "--workers", "2")) == 0
    out = capfd.readouterr().out
    assert "2 local workers" in out
    assert _check_study(tmp_path, study, exp, uri, 4) == {"0", "1"}, out[-3000:]
    assert re.search(r"\[worker [01]\] trial \d+: COMPLETE", out)  # each worker's lines are labelled
    assert (tmp_path / "out" / "best.yaml").exists()


@pytest.mark.slow
@ON_RAY
def test_two_ray_workers_on_a_local_ray_instance(tmp_path, capfd, ray_local):
    study, exp, uri = f"r-{uuid.uuid4().hex[:6]}", "ray-workers", fresh_store(tmp_path)
    assert cli_main(_argv(tmp_path, study, exp, uri, 4, "--workers", "2", "--executor", "ray")) == 0
    out = capfd.readouterr().out
    assert "2 ray workers" in out
    # (from the trials themselves: Ray's driver collapses repeated log lines of several workers)
    assert _check_study(tmp_path, study, exp, uri, 4) == {"0", "1"}, out[-3000:]


def test_bad_worker_settings_are_refused_before_anything_runs(tmp_path, capsys):
    base = _argv(tmp_path, "bad", "bad", f"sqlite:///{tmp_path}/mlflow.db", 2)
    assert cli_main([*base, "--ray-address", "auto"]) == 2
    assert "--ray-address 'auto' needs --executor ray" in capsys.readouterr().err
    assert cli_main([*base, "--workers", "-1"]) == 2
    assert "--workers must be >= 0" in capsys.readouterr().err
    if __import__("importlib").util.find_spec("ray") is not None:
        assert cli_main([*base, "--executor", "ray", "--ray-address", "auto"]) == 2
        assert "SQLite file is not shared by the nodes" in capsys.readouterr().err
    assert not (tmp_path / "optuna.db").exists()


def test_worker_seeds_differ_only_when_a_seed_is_given():
    from bench.config import TrainConfig
    from bench.tune.workers import worker_spec

    spec = tune.TuneSpec(algo="grpo", base=TrainConfig(), space={},
                         metric=tune.parse_metric("eval/accuracy"), study="s", sampler_seed=5)
    assert [worker_spec(spec, i).sampler_seed for i in range(3)] == [5, 6, 7]
    assert worker_spec(dataclasses.replace(spec, sampler_seed=None), 2).sampler_seed is None
