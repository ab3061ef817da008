"""The names of the metrics pobench logs to MLflow, for the side that writes them (bench: the engines, evaluation,
`bench tune`) and the side that reads them (reports). Each is explained in docs/METRICS.md, which
tests/reports/test_metric_keys.py keeps equal to this module. A name with ``{...}`` is a template
(``eval_key(task, metric)``, ``EVAL_TASK_SECONDS``).

The ``objective/*`` metrics are each objective's own (``algorithms/``, documented in the same file); only the one
another engine maps onto is named here (``POLICY_LOSS``). ``derived/*`` are named by ``reports.derived.DERIVED``.
"""

from __future__ import annotations

# ------------------------------------------------------------------ rollout/: the completions of a step's update
REWARD_MEAN = "rollout/reward_mean"
REWARD_STD = "rollout/reward_std"
ROLLOUT_ACCURACY = "rollout/accuracy"
ENTROPY_MEAN = "rollout/entropy_mean"
ENTROPY_P10 = "rollout/entropy_p10"
ENTROPY_P50 = "rollout/entropy_p50"
ENTROPY_P90 = "rollout/entropy_p90"
ZERO_ADV_FRAC = "rollout/zero_adv_frac"
LENGTH_MEAN = "rollout/length_mean"
LENGTH_MAX = "rollout/length_max"
TRUNCATION_RATE = "rollout/truncation_rate"
REFILL_COMPLETIONS = "rollout/refill_completions"
REFILL_ACCURACY = "rollout/refill_accuracy"
REFILL_ZERO_ADV_FRAC = "rollout/refill_zero_adv_frac"
TOKENS_PER_S = "rollout/tokens_per_s"
GEN_TOKENS = "rollout/gen_tokens"
SAMPLING_ROUNDS = "rollout/sampling_rounds"
KEPT_GROUPS = "rollout/kept_groups"
GREEDY_REWARD_MEAN = "rollout/greedy_reward_mean"

# ------------------------------------------------------------------ objective/: the objective's own (algorithms/)
POLICY_LOSS = "objective/policy_loss"

# ------------------------------------------------------------------ train/: the optimizer
LOSS = "train/loss"
GRAD_NORM = "train/grad_norm"
LR = "train/lr"
KL_REF = "train/kl_ref"
SKIPPED = "train/skipped"
ABS_LOG_RATIO = "train/abs_log_ratio"
ABS_LOG_RATIO_MAX = "train/abs_log_ratio_max"
ABS_SEQ_LOG_RATIO = "train/abs_seq_log_ratio"

# ------------------------------------------------------------------ eval/: held-out evaluation
EVAL_ACCURACY = "eval/accuracy"
EVAL_ACCURACY_SAMPLED = "eval/accuracy_sampled"
EVAL_TASK = "eval/{task}/{metric}"  # one of EVAL_TASK_METRICS, each also with _ci_low / _ci_high
EVAL_TASK_METRICS = ("greedy_acc", "pass_at_1", "pass_at_{k}", "maj_at_{k}")
EVAL_TASK_PROBLEMS = "eval/{task}/problems"
EVAL_TASK_LM_EVAL = "eval/{task}/lm_eval_acc"

# ------------------------------------------------------------------ time/: wall clock and CPU time (seconds)
ROLLOUT_S = "time/rollout_s"
SCORING_S = "time/scoring_s"
UPDATE_S = "time/update_s"
STEP_S = "time/step_s"
ELAPSED_S = "time/elapsed_s"
CPU_S = "time/cpu_s"        # cumulative CPU seconds of the training process's steps (load-independent cost axis)
EVAL_S = "time/eval_s"
EVAL_TASK_SECONDS = "time/eval_{task}_seconds"

# ------------------------------------------------------------------ sys/: the machine while the run trained
LOAD_AVG_1M = "sys/load_avg_1m"   # the machine's 1-minute load average after each step (labels wall-clock numbers)

# ------------------------------------------------------------------ perf/: throughput, as verl defines it
TOTAL_NUM_TOKENS = "perf/total_num_tokens"
THROUGHPUT = "perf/throughput"

# ------------------------------------------------------------------ tune/: `bench tune`'s trial and study runs
TUNE_INTERMEDIATE = "tune/intermediate"
TUNE_OBJECTIVE = "tune/objective"
TUNE_VALUE = "tune/value"
TUNE_BEST_VALUE = "tune/best_value"
TUNE_COUNT = "tune/n_{state}"  # complete, pruned, failed

# ------------------------------------------------------------------ summary/: on a comparison's own run (bench report)
SUMMARY_FINAL_ACC = "summary/{objective}/final_acc_mean"  # seed mean of the final held-out accuracy
SUMMARY_GAIN = "summary/{objective}/gain"                  # mean paired difference of final accuracy vs the baseline
SUMMARY_P_HOLM = "summary/{objective}/p_holm"              # Holm-corrected paired t-test p-value vs the baseline
SUMMARY_POI = "summary/{objective}/prob_improvement"       # probability of improvement over the baseline

#: metrics whose value depends on the machine's speed or load (every other one is identical for the same seed and
#: config)
TIMING_PREFIXES = ("time/", "sys/", TOKENS_PER_S, THROUGHPUT)


def eval_key(task: str, metric: str) -> str:
    """``eval/<task>/<metric>`` (MLflow keys cannot hold '@': pass@k is written pass_at_k)."""
    return EVAL_TASK.format(task=task, metric=metric.replace("@", "_at_"))


def names() -> dict[str, str]:
    """Every constant of this module: {python name: metric key}."""
    return {k: v for k, v in globals().items() if k.isupper() and isinstance(v, str) and "/" in v}
