"""Rollout metrics compare like with like: `rollout/*` describe the step's own prompts (round 0), which every objective
samples alike; what DAPO's refill rounds add is logged apart (`rollout/refill_*`)."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from bench.config import TrainConfig
from bench.engines.entry import train
from tests.conftest import fresh_store


def _run(tmp_path, algo):
    uri = fresh_store(tmp_path)
    cfg = TrainConfig(algo=algo, steps=1, prompts_per_step=8, group_size=2, max_new_tokens=32, eval_every=0,
                      eval_problems=4, samples_every=0, track_ref_kl=False, output_dir=str(tmp_path / "runs"),
                      tracking_uri=uri, run_name=algo)
    res = train(cfg)
    return MlflowClient(uri).get_run(res.run_id).data.metrics


def test_round_zero_metrics_are_identical_across_objectives_at_step_one(tmp_path):
    grpo, dapo = _run(tmp_path, "grpo"), _run(tmp_path, "dapo")
    assert dapo["rollout/sampling_rounds"] > 1, "the test needs a step where dynamic sampling refilled"
    assert dapo["rollout/refill_completions"] > 0 and 0 <= dapo["rollout/refill_accuracy"] <= 1
    for key in ("rollout/accuracy", "rollout/entropy_mean", "rollout/length_mean", "rollout/truncation_rate"):
        assert dapo[key] == grpo[key], key  # same seed, same weights, same prompts: same first-round samples
    assert not any(k.startswith("rollout/refill_") for k in grpo)  # no dynamic sampling: no refill metrics
