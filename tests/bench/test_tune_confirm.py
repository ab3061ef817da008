"""`bench tune --confirm-seeds` (bench/tune/confirm.py): the best trial against the default on fresh seeds.

Orchestration on the injected fake trainer (tests/bench/fake_trainer.py: every run's MLflow record is real, its
held-out accuracy a known function of the run), so these tests take seconds: overlapping seeds refused, the difference
is best − default, the verdict follows the interval, a finished confirm run is reused by the same command again, a
stopped confirm is resumed, a best trial that is the default trains nothing."""

from __future__ import annotations

import csv
import dataclasses
import functools
import uuid

import optuna
import pytest
from mlflow.tracking import MlflowClient

from bench import tune
from bench.cli import main as cli_main
from bench.tune.confirm import summary_of
from reports.record import CONFIRM, CONFIRM_OF, CONFIRM_TRIAL
from tests.bench import fake_trainer
from tests.conftest import fresh_store


def tuned_is_better(cfg, step: int) -> float:
    """Held-out accuracy: 0.3 + 0.05 * (seed % 3) for the default setting; a setting that overrides kl_coef (every
    trial, the best one) gains 0.1 + 0.01 * seed by the last step."""
    gain = 0.1 + 0.01 * cfg.seed if "kl_coef" in cfg.objective_overrides else 0.0
    return 0.3 + 0.05 * (cfg.seed % 3) + gain * step / cfg.steps


def _spec(tmp_path, trials: int = 2, steps: int = 2, space: dict | None = None, train_fn=None) -> tune.TuneSpec:
    from tests.bench.tune_worker import make_spec

    spec = make_spec(f"s-{uuid.uuid4().hex[:6]}", f"sqlite:///{tmp_path}/optuna.db", fresh_store(tmp_path), "confirm",
                     trials=trials, steps=steps, pruner="none")
    base = dataclasses.replace(spec.base, output_dir=str(tmp_path / "runs"), checkpoint_every=1)
    return dataclasses.replace(spec, base=base, space=space if space is not None else spec.space, sampler_seed=0,
                               train_fn=train_fn or functools.partial(fake_trainer.fake_train,
                                                                      eval_fn=tuned_is_better))


def _confirm_runs(spec: tune.TuneSpec) -> list:
    client = MlflowClient(spec.base.tracking_uri)
    exp = client.get_experiment_by_name(spec.base.experiment)
    return client.search_runs([exp.experiment_id], f"tags.`{CONFIRM_OF}` = '{spec.study}'")


def test_confirm_seeds_that_overlap_the_study_seeds_are_refused_before_anything_is_created(tmp_path, monkeypatch,
                                                                                          capsys):
    fake_trainer.inject(monkeypatch.setattr)  # (were the check missing: a quick study, not hours of training)
    db, store = tmp_path / "optuna.db", tmp_path / "mlflow.db"
    argv = ["tune", "--algo", "tepo", "--seeds", "0,1", "--confirm-seeds", "5,1", "--storage", f"sqlite:///{db}",
            "--tracking-uri", f"sqlite:///{store}", "--trials", "2", "--steps", "1", "--workers", "1",
            "--output-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--confirm-seeds 5,1 overlaps --seeds 0,1 (seed 1)" in err, err
    assert cli_main([*argv[:6], "2,x", *argv[7:]]) == 2
    assert "--confirm-seeds must be comma-separated integers" in capsys.readouterr().err
    assert not db.exists() and not store.exists()


@pytest.mark.parametrize("direction, default, best, verdict", [
    # the mean difference is +0.02 but its interval holds 0: not resolved, whatever the point estimate's sign
    ("maximize", {0: 0.5, 1: 0.5, 2: 0.5}, {0: 0.55, 1: 0.47, 2: 0.54}, "unresolved"),
    ("maximize", {0: 0.5, 1: 0.5, 2: 0.5}, {0: 0.55, 1: 0.54, 2: 0.56}, "better"),
    ("maximize", {0: 0.5, 1: 0.5, 2: 0.5}, {0: 0.45, 1: 0.46, 2: 0.44}, "worse"),
    # a minimised metric (steps_to): fewer steps is better
    ("minimize", {0: 10.0, 1: 12.0, 2: 11.0}, {0: 8.0, 1: 9.0, 2: 8.5}, "better"),
    ("minimize", {0: 10.0, 1: 12.0, 2: 11.0}, {0: 8.0, 1: 13.0, 2: 10.0}, "unresolved"),
    ("maximize", {0: 0.5}, {0: 0.9}, "unresolved"),  # one seed: no interval
])
def test_the_verdict_follows_the_interval_not_the_point_estimate(direction, default, best, verdict):
    s = tune.summarize(default, best, direction)
    assert s.verdict == verdict
    diffs = [best[k] - default[k] for k in default]
    assert s.diff == pytest.approx(sum(diffs) / len(diffs))
    if len(diffs) > 1:
        assert s.low < s.diff < s.high
    expected = {"better": "The tuned setting beats the default on fresh seeds.",
                "worse": "The tuned setting is worse than the default on fresh seeds.",
                "unresolved": f"No difference resolved with {len(diffs)} seed{'s' if len(diffs) > 1 else ''}."}
    assert s.sentence == expected[verdict]


def test_the_difference_is_best_minus_default_on_the_fresh_seeds(tmp_path):
    spec = _spec(tmp_path)
    study = tune.run_study(spec, log=lambda m: None)
    record = tune.run_confirm(spec, study, [3, 4, 5], log=lambda m: None)
    values = {(r["setting"], r["seed"]): r["value"] for r in record["runs"]}
    for seed in (3, 4, 5):  # each setting scored by its own runs, on the fresh seeds
        assert values[("default", seed)] == pytest.approx(0.3 + 0.05 * (seed % 3))
        assert values[("best", seed)] == pytest.approx(0.3 + 0.05 * (seed % 3) + 0.1 + 0.01 * seed)
    s = summary_of(record)
    assert s.seeds == [3, 4, 5] and s.diff == pytest.approx(0.14)  # mean of 0.13, 0.14, 0.15: best − default
    assert 0 < s.low < s.diff < s.high and s.verdict == "better"
    out = tmp_path / "out"
    out.mkdir()
    tune.write_confirm(study, out)
    rows = list(csv.DictReader((out / "confirm.csv").open()))
    for r in rows[:3]:
        assert float(r["diff"]) == pytest.approx(float(r["best"]) - float(r["default"])) and float(r["diff"]) > 0
    assert rows[3]["seed"] == "mean" and rows[3]["verdict"] == "better"
    assert "**The tuned setting beats the default on fresh seeds.**" in (out / "confirm.md").read_text()
    # the default setting: no override of a searched field; the best: the best trial's
    assert record["overrides"] == {"default": {}, "best": study.best_params}
    assert len(_confirm_runs(spec)) == 6


def test_a_second_identical_command_reuses_the_finished_confirm_runs(tmp_path, monkeypatch, capsys):
    fake_trainer.inject(monkeypatch.setattr)
    study, storage, uri = "reuse", f"sqlite:///{tmp_path}/optuna.db", fresh_store(tmp_path)
    out = tmp_path / "out"
    argv = ["tune", "--algo", "tepo", "--trials", "2", "--steps", "2", "--eval-every", "1", "--seeds", "0",
            "--confirm-seeds", "1,2", "--study", study, "--storage", storage, "--tracking-uri", uri,
            "--experiment", "confirm", "--output-dir", str(tmp_path / "runs"), "--out", str(out), "--workers", "1",
            "--sampler-seed", "0", "--pruner", "none"]

    def record():
        return optuna.load_study(study_name=study, storage=storage).user_attrs["confirm"]

    assert cli_main(argv) == 0
    first = record()
    assert [r["outcome"] for r in first["runs"]] == ["finished"] * 4
    assert cli_main(argv) == 0
    second = record()
    assert [r["outcome"] for r in second["runs"]] == ["reused"] * 4  # not trained again
    assert [r["run_id"] for r in second["runs"]] == [r["run_id"] for r in first["runs"]]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("confirm")
    assert len(client.search_runs([exp.experiment_id], f"tags.`{CONFIRM_OF}` = '{study}'")) == 4
    parent = client.search_runs([exp.experiment_id], "tags.`pobench.kind` = 'tune-study'")[0]
    assert parent.data.tags[CONFIRM] == summary_of(second).verdict and parent.data.tags[CONFIRM_TRIAL] == str(
        second["trial"])
    assert parent.data.metrics["tune/confirm_diff"] == pytest.approx(summary_of(second).diff)
    assert {"tune/confirm.md", "tune/confirm.csv", "tune/importance.csv"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id, "tune")}
    # --show rewrites the confirm from the study alone
    assert cli_main(["tune", "--show", "--study", study, "--storage", storage, "--out", str(tmp_path / "o2")]) == 0
    assert (tmp_path / "o2" / "confirm.md").read_text() == (out / "confirm.md").read_text()


def test_a_stopped_confirm_is_resumed_by_the_same_call(tmp_path):
    spec = _spec(tmp_path, steps=3)
    study = tune.run_study(spec, log=lambda m: None)
    calls: list[str] = []

    def stop_second(cfg, *, on_eval=None, **kw):
        """Ctrl-C during the second confirm run, at its step-2 evaluation (step 1 is checkpointed)."""
        calls.append(cfg.run_name)

        def hook(step, metrics):
            on_eval(step, metrics)
            if len(calls) == 2 and step == 2:
                raise KeyboardInterrupt
        return fake_trainer.fake_train(cfg, on_eval=hook, eval_fn=tuned_is_better, **kw)

    with pytest.raises(tune.ConfirmStopped) as e:
        tune.run_confirm(dataclasses.replace(spec, train_fn=stop_second), study, [3, 4], log=lambda m: None)
    assert (e.value.finished, e.value.total) == (1, 4)
    lines: list[str] = []
    record = tune.run_confirm(spec, study, [3, 4], log=lines.append)
    assert [r["outcome"] for r in record["runs"]] == ["reused", "finished", "finished", "finished"]
    assert "confirm: default (tepo) seed 4: resume" in lines and "confirm: default (tepo) seed 3: reused" in lines
    assert all(r["value"] is not None for r in record["runs"])
    assert summary_of(record).diff == pytest.approx(0.135)


def test_a_best_trial_that_is_the_default_trains_nothing(tmp_path):
    from algorithms.registry import default_config

    space = {"kl_coef": tune.resolve_space("tepo")["kl_coef"]}
    trained: list[str] = []

    def counting(cfg, **kw):
        trained.append(cfg.run_name)
        return fake_trainer.fake_train(cfg, eval_fn=tuned_is_better, **kw)

    spec = _spec(tmp_path, trials=1, space=space, train_fn=counting)
    study, _ = tune.open_study(spec)
    study.enqueue_trial({"kl_coef": default_config("tepo").kl_coef})  # the registered default, as the one trial
    study = tune.run_study(spec, log=lambda m: None)
    trained.clear()
    record = tune.run_confirm(spec, study, [3, 4], log=lambda m: None)
    assert record["same"] and trained == [] and not _confirm_runs(spec)
    out = tmp_path / "out"
    out.mkdir()
    tune.write_confirm(study, out)
    text = (out / "confirm.md").read_text()
    assert "sets every searched field to the objective's default: nothing to confirm" in text
