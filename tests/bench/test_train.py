"""The training loop against the real tiny model: every objective learns, resume after SIGKILL, determinism,
a real MLflow server, clear failures."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from algorithms import list_objectives
from bench.config import TrainConfig
from bench.engines import TrainingDiverged
from bench.engines.entry import train
from bench.model import resolve_model_path
from reports import metric_keys as K
from tests import launch
from tests.conftest import fresh_store

TIME_KEYS = K.TIMING_PREFIXES


def tiny(tmp_path: Path, uri: str, **kw) -> TrainConfig:
    base = dict(steps=2, prompts_per_step=4, group_size=4, max_new_tokens=32, eval_every=0, eval_problems=8,
                checkpoint_every=10, samples_every=0, lr=1e-3, output_dir=str(tmp_path / "runs"), tracking_uri=uri,
                experiment="test-train")
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return fresh_store(tmp_path_factory.mktemp("mlflow"))


def history(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    run = client.get_run(run_id)
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in run.data.metrics}


def weights(path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(path) / "model.safetensors"))


# pass@k gives an advantage only to a group's unique best completion: with binary rewards and the warm-started model
# most groups hold several correct answers, so it needs more, more diverse samples to see one in 2 steps
SAMPLING = {"grpo_passk": {"temperature": 1.5, "group_size": 8}}


@pytest.mark.slow
@pytest.mark.parametrize("algo", list_objectives())
def test_every_objective_changes_the_parameters(tmp_path, uri, algo):
    res = train(tiny(tmp_path, uri, algo=algo, run_name=f"p-{algo}", **SAMPLING.get(algo, {})))
    before = weights(resolve_model_path("builtin:tiny-arith"))
    after = weights(res.output_dir / "final")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, f"{algo}: no parameter changed in 2 steps"
    run = MlflowClient(uri).get_run(res.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["pobench.objective"] == algo
    for key in ("rollout/reward_mean", "rollout/entropy_mean", "train/grad_norm", "objective/policy_loss",
                "objective/clip_frac_low", "time/rollout_s", "rollout/zero_adv_frac", "train/kl_ref"):
        assert key in run.data.metrics, (algo, key)


@pytest.mark.slow
def test_same_seed_same_metrics(tmp_path, uri):
    kw = dict(algo="tepo", steps=3, eval_every=3)
    a = train(tiny(tmp_path / "a", uri, run_name="det-a", **kw))
    b = train(tiny(tmp_path / "b", uri, run_name="det-b", **kw))
    client = MlflowClient(uri)
    ha, hb = history(client, a.run_id), history(client, b.run_id)
    keys = [k for k in ha if not k.startswith(TIME_KEYS)]
    assert "eval/accuracy" in keys and "objective/policy_loss" in keys
    for k in keys:
        assert ha[k] == hb[k], k
    c = train(tiny(tmp_path / "c", uri, run_name="det-c", seed=1, **kw))
    assert history(client, c.run_id)["rollout/reward_mean"] != ha["rollout/reward_mean"]


@pytest.mark.slow
def test_resume_after_sigkill_has_no_missing_or_duplicated_step(tmp_path, uri, bench_here):
    # (16 new tokens, not tiny()'s 32: a resumed and an uninterrupted run are compared whatever their length; a step
    # is half the CPU)
    args = ["--algo", "grpo", "--steps", "8", "--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "16",
            "--eval-every", "4", "--eval-problems", "8", "--checkpoint-every", "2", "--samples-every", "0",
            "--lr", "1e-3", "--tracking-uri", uri, "--experiment", "test-resume", "--run-name", "killed",
            "--output-dir", str(tmp_path / "runs")]
    proc = launch.Popen([sys.executable, "-m", "bench.cli", "train", *args], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT)
    ckpt = tmp_path / "runs" / "test-resume" / "killed" / "ckpt-0000002" / "state.json"  # <experiment>/<run>
    deadline = time.time() + 600
    while not ckpt.exists():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "no checkpoint after 600 s"
        time.sleep(0.2)
    time.sleep(0.3)  # let it get into step 3 (or further) before the kill
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    client = MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name("test-resume").experiment_id])[0]
    assert run.info.status == "RUNNING"  # SIGKILL: nobody closed it
    # the same command again, without --resume: refused in one line, and the run left RUNNING is ended KILLED (held-
    # out round 3: refused, but the run stayed RUNNING)
    rc, out, err = bench_here(["train", *args], tmp_path)
    assert rc == 2 and "pass --resume to continue it" in err and "was ended KILLED" in err, err[-3000:]
    assert client.get_run(run.info.run_id).info.status == "KILLED"
    # the resume, in this process (it restores everything from the checkpoint, as a fresh process must)
    rc, out, err = bench_here(["train", *args, "--resume"], tmp_path)
    assert rc == 0, out[-3000:] + err[-3000:]
    runs = client.search_runs([run.info.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == run.info.run_id and runs[0].info.status == "FINISHED"
    h = history(client, run.info.run_id)
    assert [s for s, _ in h["rollout/reward_mean"]] == list(range(1, 9))
    assert [s for s, _ in h["train/grad_norm"]] == list(range(1, 9))
    assert [s for s, _ in h["eval/accuracy"]] == [0, 4, 8]
    # and the resumed run equals an uninterrupted one
    ref = train(tiny(tmp_path / "ref", uri, algo="grpo", steps=8, eval_every=4, checkpoint_every=2, max_new_tokens=16,
                     experiment="test-resume-ref", run_name="ref"))
    h_ref = history(client, ref.run_id)
    for k in ("rollout/reward_mean", "objective/policy_loss", "train/grad_norm", "eval/accuracy"):
        assert h[k] == h_ref[k], k


@pytest.mark.slow
def test_real_mlflow_server_receives_the_run(tmp_path, mlflow_server):
    res = train(tiny(tmp_path, mlflow_server, algo="dapo", steps=1, eval_every=1, samples_every=1))
    client = MlflowClient(mlflow_server)
    run = client.get_run(res.run_id)
    assert run.info.status == "FINISHED"
    assert "eval/accuracy" in run.data.metrics and "rollout/reward_mean" in run.data.metrics
    assert run.data.params["algo"] == "dapo" and run.data.params["objective.clip_high"] == "0.28"
    names = {a.path for a in client.list_artifacts(res.run_id)}
    assert "config.yaml" in names and "samples" in names


def test_the_sample_completions_are_one_mlflow_table_with_their_steps(tmp_path, uri):
    """What users look for in the MLflow UI: the sampled completions as a table (``log_table``), every sampled step's
    rows with their step, besides the per-step files."""
    import json

    import pandas as pd
    from mlflow import MlflowClient

    res = train(tiny(tmp_path, uri, steps=2, samples_every=1, max_new_tokens=8, prompts_per_step=2, group_size=2,
                     run_name="samples"))
    client = MlflowClient(uri)
    names = {a.path for a in client.list_artifacts(res.run_id, "samples")}
    assert names == {"samples/step_000001.json", "samples/step_000002.json"}, names
    run = client.get_run(res.run_id)
    assert "samples.json" in json.loads(run.data.tags["mlflow.loggedArtifacts"])[0]["path"]  # (what the UI lists)
    with open(client.download_artifacts(res.run_id, "samples.json", str(tmp_path))) as f:
        table = pd.read_json(f, orient="split")
    assert sorted(set(table["step"])) == [1, 2] and len(table) == 2 * 4  # (2 groups x 2 completions per step)
    assert {"question", "completion", "reward", "correct", "advantage"} <= set(table.columns)
    assert table["completion"].map(type).eq(str).all()


@pytest.mark.slow
def test_divergence_stops_with_step_and_keeps_checkpoint(tmp_path, uri):
    # one update per step, so that step 1 finishes (its one update is on-policy) and step 2 diverges
    cfg = tiny(tmp_path, uri, algo="grpo", steps=4, lr=1e30, max_grad_norm=0.0, checkpoint_every=1, minibatches=1,
               run_name="nan")
    with pytest.raises(TrainingDiverged, match=r"step [2-4]"):
        train(cfg)
    assert (tmp_path / "runs" / "nan" / "ckpt-0000001" / "state.json").exists()
    client = MlflowClient(uri)
    run = [r for r in client.search_runs([client.get_experiment_by_name("test-train").experiment_id])
           if r.info.run_name == "nan"][0]
    assert run.info.status == "FAILED" and "step" in run.data.tags["pobench.failure"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/reward_mean")][0] == 1


@pytest.mark.parametrize("engine", ["native", "trl"])
def test_an_interrupt_while_the_run_is_opened_ends_it_killed(tmp_path, uri, monkeypatch, engine):
    """A SIGTERM (here its KeyboardInterrupt) after the MLflow run was created and before the training's guard, e.g.
    while the config artifact is sent: the run ends KILLED, not left RUNNING (CI: `bench train` stopped with exit 143
    and its run RUNNING)."""
    from bench.runs.tracking import RunLogger

    if engine == "trl":
        pytest.importorskip("trl")

    def interrupted(self, path, artifact_path=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(RunLogger, "log_artifact", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(tiny(tmp_path, uri, algo="grpo", run_name=f"opened-{engine}", engine=engine))
    client = MlflowClient(uri)
    (run,) = [r for r in client.search_runs([client.get_experiment_by_name("test-train").experiment_id])
              if r.info.run_name == f"opened-{engine}"]
    assert run.info.status == "KILLED"


def test_out_of_range_config_fails_before_any_work(tmp_path, capsys):
    from bench.cli import main

    out = str(tmp_path / "runs")
    assert main(["train", "--steps", "0", "--output-dir", out]) == 2
    assert "`steps`" in capsys.readouterr().err
    assert main(["train", "--algo", "tepo", "--objective-overrides", '{"kl_coef": -1}', "--output-dir", out]) == 2
    assert "kl_coef" in capsys.readouterr().err
    assert main(["train", "--algo", "tepoo", "--output-dir", out]) == 2
    assert "did you mean 'tepo'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_existing_checkpoints_need_resume(tmp_path, uri):
    """Checkpoints in pobench's run folder: continued only with --resume. In a folder pobench did not mark, the
    same files are refused whatever the flags (it may not write there)."""
    from bench.runs.folders import claim_run_folder
    from reports.paths import UnsafePath

    run = tmp_path / "runs" / "grpo-s0"
    for marked in (False, True):
        shutil.rmtree(run, ignore_errors=True)
        if marked:
            claim_run_folder(run)
        (run / "ckpt-0000001").mkdir(parents=True)
        (run / "ckpt-0000001" / "state.json").write_text("{}")
        if not marked:
            with pytest.raises(UnsafePath, match="is not a pobench run folder"):
                train(tiny(tmp_path, uri, algo="grpo"))
    with pytest.raises(ValueError, match="--resume"):
        train(tiny(tmp_path, uri, algo="grpo"))


@pytest.mark.slow
def test_rollout_correction_and_truncation_masking_reach_the_loss(tmp_path, uri):
    """The loop passes the engine's log-probs and the truncation flags: the HF engine samples with the training
    model, so the measured sampler/trainer mismatch is ~0 and no IS weight is cut; 24 tokens truncate some
    completions (not all: with every completion masked the metrics would be vacuous, and DAPO's filter skips groups
    whose outcomes are all equal). One update per rollout: the trainer's log-probs then come from the scoring pass,
    not from the rollout, so the mismatch compares two computations (misaligned sampler log-probs would show)."""
    over = {"rollout_correction": "token-mask", "rollout_correction_cap": 2.0, "mask_truncated": True}
    res = train(tiny(tmp_path, uri, algo="dapo", objective_overrides=over, max_new_tokens=24, minibatches=1,
                     run_name="rc"))
    m = MlflowClient(uri).get_run(res.run_id).data.metrics
    assert m["objective/mismatch_kl_k3"] < 1e-4 and m["objective/is_cut_frac"] == 0.0
    assert m["objective/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert 0 < m["objective/truncated_masked_frac"] < 1


def test_throughput_is_verls_tokens_per_step_second(tmp_path, uri):
    from bench.data import TrainData
    from bench.model import format_prompt, load_policy

    cfg = tiny(tmp_path, uri, steps=1, run_name="perf")
    res = train(cfg)
    h = {k: v[0][1] for k, v in history(MlflowClient(uri), res.run_id).items()}
    _, tok = load_policy(cfg.model)
    problems = TrainData(cfg.task, seed=cfg.seed, steps=cfg.steps, prompts_per_step=cfg.prompts_per_step).batch(1)
    prompt_tokens = sum(len(tok(format_prompt(tok, p.question, cfg.prompt_template))["input_ids"]) for p in problems)
    n = cfg.prompts_per_step * cfg.group_size
    expected = cfg.group_size * prompt_tokens + n * h["rollout/length_mean"]  # each completion with its prompt
    assert h["perf/total_num_tokens"] == pytest.approx(expected)
    assert h["perf/throughput"] == pytest.approx(h["perf/total_num_tokens"] / h["time/step_s"], rel=1e-6)
