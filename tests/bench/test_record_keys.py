"""The MLflow record of `bench run`, `bench eval` and `bench tune`: the exact tag, metric (and param) keys of the runs
each writes.

The expected keys are written out here as literals (captured from the code before the record definitions were
gathered in ``reports/record.py``), so a refactor that drops or renames a key fails this test. Adding a key is a
change of the record: add it here too, and to docs/METRICS.md.
"""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from bench.cli import main
from bench.runs.tracking import version_tags
from tests.conftest import fresh_store

DERIVED = ("acc_collapse_step", "acc_drawdown", "best_acc", "entropy_blowup_step", "entropy_change",
           "entropy_collapse_step", "entropy_slope", "final_acc", "grad_spikes", "initial_acc", "kl_max", "load_avg",
           "reward_var", "target_acc", "ttc_cpu_s_interp", "ttc_seconds", "ttc_seconds_interp", "ttc_step",
           "ttc_step_interp", "ttc_tokens_interp", "zero_adv_frac")

# from a git checkout (CI's): MLflow's commit tag and pobench.git_dirty (tests/bench/test_tracking_tags.py)
GIT = set(version_tags()) - {"pobench.version", "pobench.git_commit"}

# tags of a training run; "pobench.in.{cid}" stands for the membership tag of this comparison
TRAIN_TAGS = {*GIT,
    "mlflow.parentRunId", "mlflow.runName",
    "pobench.comparison", "pobench.config_hash", "pobench.control", "pobench.git_commit", "pobench.in.{cid}",
    "pobench.kind", "pobench.model", "pobench.objective", "pobench.overrides", "pobench.seed", "pobench.task",
    "pobench.version", "pobench.derived.comparison", *(f"pobench.derived.{d}" for d in DERIVED),
}

COMMON_METRICS = {
    *(f"derived/{d}" for d in DERIVED),
    "eval/accuracy", "eval/arith/greedy_acc", "eval/arith/greedy_acc_ci_high", "eval/arith/greedy_acc_ci_low",
    "objective/clip_frac_high", "objective/clip_frac_low", "objective/entropy", "objective/kl_term",
    "objective/policy_loss", "objective/ratio_max", "objective/ratio_mean", "perf/throughput", "perf/total_num_tokens",
    "rollout/accuracy", "rollout/entropy_mean", "rollout/entropy_p10", "rollout/entropy_p50", "rollout/entropy_p90",
    "rollout/gen_tokens", "rollout/kept_groups", "rollout/length_max", "rollout/length_mean", "rollout/reward_mean",
    "rollout/reward_std",
    "rollout/sampling_rounds", "rollout/tokens_per_s", "rollout/truncation_rate", "rollout/zero_adv_frac",
    "sys/load_avg_1m", "time/cpu_s",
    "time/elapsed_s", "time/eval_s", "time/rollout_s", "time/scoring_s", "time/step_s", "time/update_s",
    "train/abs_log_ratio", "train/abs_log_ratio_max", "train/abs_seq_log_ratio", "train/grad_norm", "train/kl_ref",
    "train/loss", "train/lr",
    # MLflow's system metrics of a machine without a GPU (bench/runs/system_metrics.py)
    "system/cpu_utilization_percentage", "system/system_memory_usage_megabytes",
    "system/system_memory_usage_percentage", "system/disk_usage_percentage", "system/disk_usage_megabytes",
    "system/disk_available_megabytes", "system/network_receive_megabytes", "system/network_transmit_megabytes",
}
TRAIN_METRICS = {
    "grpo": COMMON_METRICS | {"objective/mismatch_kl_k1", "objective/mismatch_kl_k3"},
    "tepo": COMMON_METRICS | {"objective/masked_frac"},
}

COMPARISON_TAGS = {"mlflow.runName", "pobench.baseline", "pobench.comparison", "pobench.config_hash",
                   "pobench.kind", "pobench.objectives", "pobench.seeds"}
# bench report's summary (grpo the baseline); the Holm p-value only where the paired t-test has one (not when the
# seeds' differences are all equal)
COMPARISON_METRICS = {"summary/grpo/final_acc_mean", "summary/tepo/final_acc_mean", "summary/tepo/gain",
                      "summary/tepo/prob_improvement"}


@pytest.mark.slow
def test_bench_run_writes_exactly_the_recorded_keys(tmp_path):
    uri = fresh_store(tmp_path)
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
    assert COMPARISON_METRICS <= set(comparison.data.metrics) <= COMPARISON_METRICS | {"summary/tepo/p_holm"}

    train = {r.data.tags["pobench.objective"]: r for r in by_kind["train"]}
    assert sorted(train) == ["grpo", "tepo"]
    for objective, r in train.items():
        tags = {k.replace(f"pobench.in.{cid}", "pobench.in.{cid}") for k in r.data.tags}
        assert tags == TRAIN_TAGS, (objective, sorted(tags ^ TRAIN_TAGS))
        assert set(r.data.metrics) == TRAIN_METRICS[objective], (
            objective, sorted(set(r.data.metrics) ^ TRAIN_METRICS[objective]))



# `bench eval` (one benchmark, --k 2): one run of kind eval
EVAL_TAGS = {*GIT, "mlflow.runName", "pobench.git_commit", "pobench.kind", "pobench.version"}
EVAL_METRICS = {"time/eval_arith_seconds", "eval/arith/problems",
                *(f"eval/arith/{m}{s}" for m in ("greedy_acc", "pass_at_1", "pass_at_2", "maj_at_2")
                  for s in ("", "_ci_low", "_ci_high"))}
EVAL_PARAMS = {"backend", "benchmarks", "k", "limit", "max_new_tokens", "model", "n_samples", "prompt_template",
               "seed", "split", "temperature", "top_p"}

# `bench tune` (grpo, one trial, one seed): the study run, its trial run, and the trial's training run
STUDY_TAGS = {"mlflow.runName", "pobench.best_trial", "pobench.best_value", "pobench.kind", "pobench.objective",
              "pobench.study", "pobench.version", "best.clip_high", "best.clip_low", "best.kl_coef"}
STUDY_METRICS = {"tune/best_value", "tune/n_complete", "tune/n_failed", "tune/n_pruned", "tune/value"}
STUDY_PARAMS = {"algo", "config_hash", "direction", "metric", "pruner", "seeds", "space.clip_high", "space.clip_low",
                "space.kl_coef", "steps", "storage", "trials"}
SAMPLED_EVAL = {"eval/accuracy", "eval/accuracy_sampled",
                *(f"eval/arith/{m}{s}" for m in ("greedy_acc", "pass_at_1", "maj_at_1")
                  for s in ("", "_ci_low", "_ci_high"))}
TRIAL_TAGS = {"mlflow.parentRunId", "mlflow.runName", "pobench.kind", "pobench.objective", "pobench.study",
              "pobench.trial", "pobench.trial_state", "pobench.version"}
TRIAL_METRICS = SAMPLED_EVAL | {"tune/intermediate", "tune/objective"}
TRIAL_PARAMS = {"clip_high", "clip_low", "kl_coef", "seeds"}
TUNE_TRAIN_TAGS = {*GIT, "mlflow.parentRunId", "mlflow.runName", "pobench.config_hash", "pobench.control",
                   "pobench.git_commit", "pobench.kind", "pobench.model", "pobench.objective", "pobench.seed",
                   "pobench.study", "pobench.task", "pobench.trial", "pobench.version"}
TUNE_TRAIN_METRICS = ((COMMON_METRICS - {f"derived/{d}" for d in DERIVED} - {
    "eval/arith/greedy_acc", "eval/arith/greedy_acc_ci_high", "eval/arith/greedy_acc_ci_low", "eval/accuracy"})
    | SAMPLED_EVAL | {"objective/mismatch_kl_k1", "objective/mismatch_kl_k3"})


def _keys(client, exp: str) -> dict[str, list[tuple[set[str], set[str], set[str]]]]:
    """kind -> [(tag keys, metric keys, param keys)] of every run of the experiment."""
    out: dict[str, list] = {}
    for r in client.search_runs([client.get_experiment_by_name(exp).experiment_id]):
        out.setdefault(r.data.tags.get("pobench.kind", "?"), []).append(
            (set(r.data.tags), set(r.data.metrics), set(r.data.params)))
    return out


@pytest.mark.slow
def test_bench_eval_writes_exactly_the_recorded_keys(tmp_path):
    uri = fresh_store(tmp_path)
    assert main(["eval", "--benchmarks", "arith", "--limit", "3", "--k", "2", "--max-new-tokens", "16",
                 "--experiment", "keys", "--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 0
    runs = _keys(MlflowClient(uri), "keys")
    assert sorted(runs) == ["eval"] and len(runs["eval"]) == 1
    tags, metrics, params = runs["eval"][0]
    assert tags == EVAL_TAGS, sorted(tags ^ EVAL_TAGS)
    assert metrics == EVAL_METRICS, sorted(metrics ^ EVAL_METRICS)
    assert params == EVAL_PARAMS, sorted(params ^ EVAL_PARAMS)


@pytest.mark.slow
def test_bench_tune_writes_exactly_the_recorded_keys(tmp_path):
    uri = fresh_store(tmp_path)
    assert main(["tune", "--algo", "grpo", "--trials", "1", "--steps", "1", "--seeds", "0", "--study", "keys",
                 "--storage", f"sqlite:///{tmp_path}/optuna.db", "--tracking-uri", uri, "--out", str(tmp_path / "o"),
                 "--prompts-per-step", "2", "--group-size", "2", "--eval-problems", "4", "--eval-every", "1",
                 "--max-new-tokens", "16", "--experiment", "keys", "--output-dir", str(tmp_path / "runs"),
                 "--samples-every", "0", "--sampler-seed", "0"]) == 0
    runs = _keys(MlflowClient(uri), "keys")
    assert sorted(runs) == ["train", "tune-study", "tune-trial"] and all(len(v) == 1 for v in runs.values())
    for kind, (want_tags, want_metrics, want_params) in {
            "tune-study": (STUDY_TAGS, STUDY_METRICS, STUDY_PARAMS),
            "tune-trial": (TRIAL_TAGS, TRIAL_METRICS, TRIAL_PARAMS),
            "train": (TUNE_TRAIN_TAGS, TUNE_TRAIN_METRICS, None)}.items():
        tags, metrics, params = runs[kind][0]
        assert tags == want_tags, (kind, sorted(tags ^ want_tags))
        assert metrics == want_metrics, (kind, sorted(metrics ^ want_metrics))
        if want_params is not None:  # (a training run's params are its whole TrainConfig: test_cli pins those)
            assert params == want_params, (kind, sorted(params ^ want_params))
