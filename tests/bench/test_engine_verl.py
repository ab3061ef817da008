"""`--engine verl` on this CPU, in the project's own environment (no verl: it lives in `tox -e verl`, and a verl run
needs GPUs): the clear refusal when verl is missing, engine_args checked against the verl options, and the launch
path around verl's process: the data it is given, the MLflow run with a native run's tags and params, verl's metric
names translated to pobench's, and a failing verl job recorded as FAILED with its exit code. Only verl's trainer
process is not real here: a small program in its place logs what verl's MLflow logger logs, or exits with an error.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from bench.cli import main
from bench.config import TrainConfig
from bench.runs.tracking import version_tags

GSM8K_ROWS = [{"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
               "answer": f"{a} + {b} = {a + b}\n#### {a + b}"} for a, b in ((2, 3), (4, 5), (1, 7), (6, 2))]


def _config(tmp_path, **kw) -> TrainConfig:
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    base = dict(algo="tepo", seed=0, engine="verl", model="Qwen/Qwen2.5-Math-1.5B", task="gsm8k", data=str(data),
                eval_data=str(data), eval_problems=2, steps=2, prompts_per_step=4, minibatches=2, group_size=2,
                max_new_tokens=32, output_dir=str(tmp_path / "runs"), tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                experiment="verl-engine")
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed in this environment")
def test_engine_verl_without_verl_is_one_clear_error(tmp_path, capsys):
    cfg = _config(tmp_path)
    cfg.save(tmp_path / "run.yaml")
    assert main(["train", "--config", str(tmp_path / "run.yaml")]) == 2
    err = capsys.readouterr().err
    assert "verl is not installed" in err and "verl==0.9.1" in err and "Traceback" not in err
    assert not (tmp_path / "mlflow.db").exists()  # nothing was started


def test_bench_run_refuses_what_verl_cannot_run_before_any_pair(tmp_path, capsys):
    cfg = _config(tmp_path, model="builtin:tiny-arith")
    cfg.save(tmp_path / "run.yaml")
    assert main(["run", "--config", str(tmp_path / "run.yaml"), "--algos", "grpo,tepo", "--seeds", "0",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "built-in toy model: verl needs a Hugging Face model" in err and "Traceback" not in err
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_engine_args_are_checked_against_the_verl_options(tmp_path):
    _config(tmp_path, engine_args={"n_gpus_per_node": 4, "rollout_engine": "sglang"}).validate()
    with pytest.raises(ValueError, match=r"engine_args.*n_gpu_per_node.*valid: .*n_gpus_per_node"):
        _config(tmp_path, engine_args={"n_gpu_per_node": 4}).validate()


FAKE_VERL = textwrap.dedent('''
    """Stands in for `python -m verl.trainer.main_ppo ARGS` (GPUs needed): records its arguments, then logs what
    verl's MLflow logger logs into the run named by MLFLOW_RUN_ID, or exits with the code in FAKE_VERL_RC."""
    import json, os, sys
    from pathlib import Path
    out = Path(os.environ["FAKE_VERL_OUT"])
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if fd.isdigit()
           and os.path.exists(f"/proc/self/fd/{fd}")]  # (the files it holds open: the run folder's lock, inherited)
    out.write_text(json.dumps({"argv": sys.argv[1:], "run_id": os.environ.get("MLFLOW_RUN_ID"), "fds": fds}))
    rc = int(os.environ.get("FAKE_VERL_RC", "0"))
    if rc == 0:
        from mlflow import MlflowClient
        from mlflow.entities import Metric
        c = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
        # (verl's MLflow logger writes "mean@1" as "mean_at_1": MLflow refuses "@")
        ms = [Metric("val-core/gsm8k/acc/mean_at_1", v, 0, s) for s, v in ((0, 0.25), (2, 0.5))]
        ms += [Metric("timing_s/step", 3.0 + s, 0, s) for s in (1, 2)]
        ms += [Metric("critic/score/mean", 0.1 * s, 0, s) for s in (1, 2)]
        ms += [Metric("actor/unmapped", 1.0, 0, 1)]
        c.log_batch(os.environ["MLFLOW_RUN_ID"], metrics=ms)
    sys.exit(rc)
''')


def _fake_python(tmp_path) -> str:
    """An executable called as `PY -m verl.trainer.main_ppo ...`: runs FAKE_VERL with this interpreter."""
    script = tmp_path / "fake_verl.py"
    script.write_text(FAKE_VERL)
    exe = tmp_path / "python-fake"
    # `PY -c CODE` (the check that verl imports) runs CODE with a stub verl package on the path; `PY -m verl...` runs
    # FAKE_VERL with the arguments after `-m verl.trainer.main_ppo`
    (tmp_path / "stub" / "verl").mkdir(parents=True)
    (tmp_path / "stub" / "verl" / "__init__.py").write_text("")
    exe.write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then PYTHONPATH={tmp_path / 'stub'} exec {sys.executable} \"$@\"; "
                   f"fi\nshift 2\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def test_launch_takes_its_run_folder_through_the_one_lifecycle(tmp_path, monkeypatch):
    """verl's launch claims its run folder as every engine does (``lifecycle.run_folder``): a folder in the way that
    is not pobench's is refused before verl starts, before any data is written and before an MLflow run exists; its
    own folder gets pobench's marker."""
    from bench.engines.verl.launch import launch_run
    from bench.engines.verl.run import options_from
    from reports.paths import MARKER, UnsafePath

    monkeypatch.setenv("FAKE_VERL_OUT", str(tmp_path / "verl-call.json"))
    monkeypatch.setenv("FAKE_VERL_RC", "0")
    cfg = _config(tmp_path)
    run_dir = cfg.run_dir()
    run_dir.mkdir(parents=True)
    (run_dir / "important.txt").write_text("notes")
    python = _fake_python(tmp_path)
    with pytest.raises(UnsafePath, match="not a pobench run folder"):
        launch_run(cfg, options_from({"n_gpus_per_node": 1}), python=python)
    assert [p.name for p in run_dir.iterdir()] == ["important.txt"] and not (tmp_path / "verl-call.json").exists()
    client = MlflowClient(cfg.tracking_uri)
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])
    (run_dir / "important.txt").unlink()
    assert launch_run(cfg, options_from({"n_gpus_per_node": 1}), python=python)[0] == 0
    assert (run_dir / MARKER).is_file() and (run_dir / "verl-data" / "train.parquet").is_file()


@pytest.mark.parametrize("rc", [0, 3])
def test_launch_path_records_a_native_looking_run(tmp_path, monkeypatch, rc):
    from algorithms import get_objective
    from bench.engines.verl.launch import launch_run
    from bench.engines.verl.run import options_from
    from bench.runs.locks import folder_in_use, folder_lock_path

    monkeypatch.setenv("FAKE_VERL_OUT", str(tmp_path / "verl-call.json"))
    monkeypatch.setenv("FAKE_VERL_RC", str(rc))
    cfg = _config(tmp_path)
    got_rc, run_id = launch_run(cfg, options_from({"n_gpus_per_node": 1}), python=_fake_python(tmp_path))
    assert got_rc == rc
    call = json.loads((tmp_path / "verl-call.json").read_text())
    assert call["run_id"] == run_id
    # verl's trainer holds the run folder's lock with the launcher (a killed launcher's verl still keeps the folder:
    # no other training goes into it, its live run is not taken as abandoned); released once the run ended
    lock = folder_lock_path(cfg.run_dir())
    assert str(lock.resolve()) in call["fds"] and not folder_in_use(cfg.run_dir())
    args = {k: v.strip("'") for k, v in (a.split("=", 1) for a in call["argv"] if "=" in a)}  # (Hydra quoting)
    assert args["actor_rollout_ref.actor.policy_loss.loss_mode"] == "pobench_tepo"
    assert args["trainer.n_gpus_per_node"] == "1" and args["trainer.total_training_steps"] == "2"
    train = pq.read_table(args["data.train_files"]).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in train] == ["5", "9", "8", "8"]

    client = MlflowClient(cfg.tracking_uri)
    run = client.get_run(run_id)
    tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
    assert set(tags) == {"pobench.kind", "pobench.objective", "pobench.seed", "pobench.config_hash", "pobench.model",
                         "pobench.task", "pobench.control", "pobench.version", "pobench.git_commit", "pobench.engine",
                         *(["pobench.failure"] if rc else []),
                         *({"pobench.git_dirty"} & set(version_tags()))}  # a native training run's (test_record_keys)
    assert (tags["pobench.kind"], tags["pobench.objective"], tags["pobench.seed"], tags["pobench.engine"]) == (
        "train", "tepo", "0", "verl")
    assert tags["pobench.config_hash"] == cfg.comparison_hash() != dataclasses.replace(
        cfg, engine="native", engine_args={}).comparison_hash()  # the engine is part of the comparison
    assert tags.get("pobench.failure") == ("verl main_ppo exited with 3" if rc else None)
    objective_fields = {f"objective.{f.name}" for f in dataclasses.fields(get_objective("tepo").config)}
    config_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert objective_fields <= set(run.data.params)
    assert config_fields <= {k.split(".")[0] for k in run.data.params}
    assert run.data.params["engine"] == "verl" and run.data.params["algo"] == "tepo"
    assert run.info.status == ("FAILED" if rc else "FINISHED")
    if rc:
        return
    hist = {k: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)]
            for k in ("eval/accuracy", "time/step_s", "time/elapsed_s", "rollout/reward_mean")}
    assert hist == {"eval/accuracy": [(0, 0.25), (2, 0.5)], "time/step_s": [(1, 4.0), (2, 5.0)],
                    "time/elapsed_s": [(1, 4.0), (2, 9.0)], "rollout/reward_mean": [(1, 0.1), (2, 0.2)]}
    assert "actor/unmapped" in run.data.metrics  # verl's own names stay beside pobench's


def test_verl_train_hands_evaluations_to_on_eval_and_fails_loudly(tmp_path, monkeypatch):
    from bench.engines import StopTraining
    from bench.engines.entry import train

    monkeypatch.setenv("FAKE_VERL_OUT", str(tmp_path / "verl-call.json"))
    verl_env = {"n_gpus_per_node": 1, "python": _fake_python(tmp_path)}  # verl's own environment: FAKE_VERL
    seen = []

    def on_eval(step, m):
        seen.append((step, m["eval/accuracy"], m["time/elapsed_s"]))
        raise StopTraining  # too late for a verl run: ignored (module doc)

    res = train(_config(tmp_path, engine_args=verl_env), on_eval=on_eval)
    assert seen == [(0, 0.25, 0.0), (2, 0.5, 9.0)]  # with the training time up to that step (verl's timing_s/step)
    assert res.final_eval == {"eval/accuracy": 0.5} and not res.stopped_early
    monkeypatch.setenv("FAKE_VERL_RC", "1")
    with pytest.raises(RuntimeError, match="verl exited with 1"):
        train(_config(tmp_path, run_name="again", engine_args=verl_env))
    assert os.path.exists(tmp_path / "runs" / "again" / "verl-data" / "train.parquet")
    # an interpreter that is not there: refused before anything is written
    with pytest.raises(ValueError, match="python=.*-missing.* cannot be run"):
        train(_config(tmp_path, run_name="none", engine_args={"python": sys.executable + "-missing"}))
    assert not (tmp_path / "runs" / "none").exists()


def test_what_a_verl_run_cannot_do_is_refused(tmp_path, capsys):
    from bench.engines.verl.run import check_options

    verl_env = {"n_gpus_per_node": 1, "python": _fake_python(tmp_path)}
    with pytest.raises(ValueError, match="--resume is not supported"):
        check_options(_config(tmp_path, resume=True, engine_args=verl_env))
    with pytest.raises(ValueError, match="built-in toy task"):
        check_options(_config(tmp_path, task="arith", data=None, eval_data=None, engine_args=verl_env))
    cfg = _config(tmp_path, engine_args=verl_env)
    cfg.save(tmp_path / "run.yaml")
    for extra in (["--workers", "2"], ["--executor", "ray"]):
        assert main(["run", "--config", str(tmp_path / "run.yaml"), "--algos", "tepo", "--seeds", "0",
                     "--no-progress", *extra]) == 2
        assert "one pair at a time" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    # where verl is installed and where its data goes are not part of the comparison; its cluster options are
    assert (_config(tmp_path, engine_args={"python": "/a/bin/python", "data_dir": "/x"}).comparison_hash()
            == _config(tmp_path, engine_args={"python": "/b/bin/python"}).comparison_hash()
            != _config(tmp_path, engine_args={"n_gpus_per_node": 4}).comparison_hash())


def test_a_pruner_cannot_cut_a_verl_trial_short():
    """An engine that hands evaluations over after its run (verl) cannot stop early: the trial is complete, with its
    whole curve, although the pruner asked to stop; an engine that stops (native, TRL) is pruned."""
    from bench.engines import StopTraining, TrainResult
    from bench.tune.metric import parse_metric
    from bench.tune.study import _train_one

    def engine(stops: bool):
        def train_fn(cfg, on_eval):
            for step in (0, 1, 2):
                try:
                    on_eval(step, {"eval/accuracy": 0.1 * step, "time/elapsed_s": float(step)})
                except StopTraining:
                    if stops:
                        return TrainResult("r", step, tmp_path, {}, True)
            return TrainResult("r", 2, tmp_path, {"eval/accuracy": 0.2}, False)
        return train_fn

    tmp_path = Path(".")
    for stops, pruned, steps in ((True, True, [0]), (False, False, [0, 1, 2])):
        curve: dict = {}
        assert _train_one(TrainConfig(steps=2), parse_metric("eval/accuracy"), engine(stops), curve,
                          lambda value, step: True, 0) is pruned
        assert sorted(curve) == steps


def test_docs_table_is_the_code_table():
    """docs/SCALE.md's objective table is `python -m bench.engines.verl --table`: a row for every registered objective,
    checked here in the project's own environment (the mapping needs no verl), so a newly registered objective without
    its row fails the main suite and not only `tox -e verl`."""
    from bench.engines.verl import objective_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "SCALE.md").read_text()
    for p in objective_table():
        assert f"| `{p.objective}` | {p.how()} |" in doc, p.objective
