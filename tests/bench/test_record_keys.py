"""The MLflow record of `bench run`: the exact tag keys and metric keys of its training runs and its comparison run.

The expected keys are written out here as literals (captured from the code before the record definitions were
gathered in ``reports/record.py``), so a refactor that drops or renames a key fails this test. Adding a key is a
change of the record: add it here too, and to docs/METRICS.md.
"""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from bench.cli import main

DERIVED = ("acc_drawdown", "best_acc", "entropy_collapse_step", "entropy_slope", "final_acc", "grad_spikes",
           "initial_acc", "kl_max", "reward_var", "target_acc", "ttc_seconds", "ttc_step", "zero_adv_frac")

# tags of a training run; "pobench.in.{cid}" stands for the membership tag of this comparison
TRAIN_TAGS = {
    "mlflow.parentRunId", "mlflow.runName",
    "pobench.comparison", "pobench.config_hash", "pobench.control", "pobench.git_commit", "pobench.in.{cid}",
    "pobench.kind", "pobench.model", "pobench.objective", "pobench.overrides", "pobench.seed", "pobench.task",
    "pobench.version", "pobench.derived.comparison", *(f"pobench.derived.{d}" for d in DERIVED),
}

COMMON_METRICS = {
    *(f"derived/{d}" for d in DERIVED),
    "eval/accuracy", "eval/arith/greedy_acc", "eval/arith/greedy_acc_ci_high", "eval/arith/greedy_acc_ci_low",
    "objective/clip_frac_high", "objective/clip_frac_low", "objective/entropy", "objective/kl_term",
    "objective/policy_loss", "objective/ratio_max", "objective/ratio_mean",
    "rollout/accuracy", "rollout/entropy_mean", "rollout/entropy_p10", "rollout/entropy_p50", "rollout/entropy_p90",
    "rollout/kept_groups", "rollout/length_max", "rollout/length_mean", "rollout/reward_mean", "rollout/reward_std",
    "rollout/sampling_rounds", "rollout/tokens_per_s", "rollout/truncation_rate", "rollout/zero_adv_frac",
    "time/elapsed_s", "time/eval_s", "time/rollout_s", "time/scoring_s", "time/step_s", "time/update_s",
    "train/abs_log_ratio", "train/abs_log_ratio_max", "train/abs_seq_log_ratio", "train/grad_norm", "train/kl_ref",
    "train/loss", "train/lr",
}
TRAIN_METRICS = {
    "grpo": COMMON_METRICS | {"objective/mismatch_kl_k1", "objective/mismatch_kl_k3"},
    "tepo": COMMON_METRICS | {"objective/masked_frac"},
}

COMPARISON_TAGS = {"mlflow.runName", "pobench.comparison", "pobench.config_hash", "pobench.kind",
                   "pobench.objectives", "pobench.seeds"}
COMPARISON_METRICS: set[str] = set()


@pytest.mark.slow
def test_bench_run_writes_exactly_the_recorded_keys(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["run", "--algos", "grpo,tepo", "--seeds", "0", "--steps", "2", "--prompts-per-step", "2",
                 "--group-size", "2", "--eval-problems", "8", "--eval-every", "1", "--checkpoint-every", "1",
                 "--max-new-tokens", "16", "--samples-every", "0", "--workers", "1", "--no-progress",
                 "--experiment", "keys", "--tracking-uri", uri, "--output-dir", str(tmp_path / "runs"),
                 "--out-root", str(tmp_path / "out")]) == 0

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("keys").experiment_id])
    by_kind: dict[str, list] = {}
    for r in runs:
        by_kind.setdefault(r.data.tags["pobench.kind"], []).append(r)
    assert sorted(by_kind) == ["comparison", "train"]
    (comparison,) = by_kind["comparison"]
    cid = comparison.data.tags["pobench.comparison"]

    assert set(comparison.data.tags) == COMPARISON_TAGS
    assert set(comparison.data.metrics) == COMPARISON_METRICS

    train = {r.data.tags["pobench.objective"]: r for r in by_kind["train"]}
    assert sorted(train) == ["grpo", "tepo"]
    for objective, r in train.items():
        tags = {k.replace(f"pobench.in.{cid}", "pobench.in.{cid}") for k in r.data.tags}
        assert tags == TRAIN_TAGS, (objective, sorted(tags ^ TRAIN_TAGS))
        assert set(r.data.metrics) == TRAIN_METRICS[objective], (
            objective, sorted(set(r.data.metrics) ^ TRAIN_METRICS[objective]))
