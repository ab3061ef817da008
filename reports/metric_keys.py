"""The names of the metrics pobench logs to MLflow, for the side that writes them (bench: the engines, evaluation,
`bench tune`) and the side that reads them (reports). Each is explained in docs/METRICS.md, which
tests/reports/test_metric_keys.py keeps equal to this module. A name with ``{...}`` is a template
(``eval_key(task, metric)``, ``EVAL_TASK_SECONDS``).

The ``objective/*`` metrics are each objective's own (``algorithms/``, documented in the same file); only the one
another engine maps onto is named here (``POLICY_LOSS``). ``derived/*`` are named by ``reports.derived.DERIVED``.

Each metric also states, once, the values it can take (:data:`DOMAINS`, :data:`TEMPLATE_DOMAINS`,
:data:`OBJECTIVE_DOMAINS`; :func:`domain` reads them): bounds the reports' bands stay within (reports/figures.py), and
whether it is an accuracy, which the reports show in their accuracy unit (percent, or fractions with ``--fractions``:
``reports.tables.Units``). tests/reports/test_metric_keys.py checks that every key here and every ``objective/`` key
of docs/METRICS.md has one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
TUNE_IMPORTANCE = "tune/importance/{param}"  # fANOVA importance (sums to 1), step = complete trials it rests on
TUNE_CONFIRM = "tune/confirm_{stat}"  # default, best, diff, diff_low, diff_high, p; step = seeds it rests on

# ------------------------------------------------------------------ summary/: on a comparison's own run (bench report)
SUMMARY_FINAL_ACC = "summary/{objective}/final_acc_mean"  # seed mean of the final held-out accuracy
SUMMARY_GAIN = "summary/{objective}/gain"                  # mean paired difference of final accuracy vs the baseline
SUMMARY_P_HOLM = "summary/{objective}/p_holm"              # Holm-corrected paired t-test p-value vs the baseline
SUMMARY_POI = "summary/{objective}/prob_improvement"       # probability of improvement over the baseline

#: metrics whose value depends on the machine's speed or load (every other one is identical for the same seed and
#: config)
TIMING_PREFIXES = ("time/", "sys/", "system/", TOKENS_PER_S, THROUGHPUT)



@dataclass(frozen=True)
class Domain:
    """The values a metric can take (``low`` / ``high``; None: unbounded on that side) and whether it is an accuracy:
    a share of problems or completions the verifier judges correct, shown in the reports' accuracy unit."""

    low: float | None = None
    high: float | None = None
    accuracy: bool = False


ANY = Domain()
NON_NEGATIVE = Domain(0.0)                   # counts, lengths, entropies, norms, times, k3 KL estimates, ratios
SHARE = Domain(0.0, 1.0)                     # a fraction or a rate (and a 0/1 flag, whose seed mean is one)
ACCURACY = Domain(0.0, 1.0, accuracy=True)   # a fraction judged correct: percent in the reports by default

DOMAINS: dict[str, Domain] = {
    REWARD_MEAN: ANY, REWARD_STD: NON_NEGATIVE, ROLLOUT_ACCURACY: ACCURACY, ENTROPY_MEAN: NON_NEGATIVE,
    ENTROPY_P10: NON_NEGATIVE, ENTROPY_P50: NON_NEGATIVE, ENTROPY_P90: NON_NEGATIVE, ZERO_ADV_FRAC: SHARE,
    LENGTH_MEAN: NON_NEGATIVE, LENGTH_MAX: NON_NEGATIVE, TRUNCATION_RATE: SHARE, REFILL_COMPLETIONS: NON_NEGATIVE,
    REFILL_ACCURACY: ACCURACY, REFILL_ZERO_ADV_FRAC: SHARE, TOKENS_PER_S: NON_NEGATIVE, GEN_TOKENS: NON_NEGATIVE,
    SAMPLING_ROUNDS: NON_NEGATIVE, KEPT_GROUPS: NON_NEGATIVE, GREEDY_REWARD_MEAN: ANY,
    POLICY_LOSS: ANY,
    LOSS: ANY, GRAD_NORM: NON_NEGATIVE, LR: NON_NEGATIVE, KL_REF: NON_NEGATIVE, SKIPPED: SHARE,
    ABS_LOG_RATIO: NON_NEGATIVE, ABS_LOG_RATIO_MAX: NON_NEGATIVE, ABS_SEQ_LOG_RATIO: NON_NEGATIVE,
    EVAL_ACCURACY: ACCURACY, EVAL_ACCURACY_SAMPLED: ACCURACY,
    ROLLOUT_S: NON_NEGATIVE, SCORING_S: NON_NEGATIVE, UPDATE_S: NON_NEGATIVE, STEP_S: NON_NEGATIVE,
    ELAPSED_S: NON_NEGATIVE, EVAL_S: NON_NEGATIVE, CPU_S: NON_NEGATIVE, LOAD_AVG_1M: NON_NEGATIVE,
    TOTAL_NUM_TOKENS: NON_NEGATIVE, THROUGHPUT: NON_NEGATIVE,
    TUNE_INTERMEDIATE: ANY, TUNE_OBJECTIVE: ANY, TUNE_VALUE: ANY, TUNE_BEST_VALUE: ANY,
}

#: the names with a ``{...}`` field, most specific first (``eval/<task>/problems`` before ``eval/<task>/<metric>``)
TEMPLATE_DOMAINS: dict[str, Domain] = {
    EVAL_TASK_PROBLEMS: NON_NEGATIVE, EVAL_TASK_LM_EVAL: ACCURACY,
    EVAL_TASK: ACCURACY,                     # greedy_acc, pass_at_k, maj_at_k and their _ci_low / _ci_high
    EVAL_TASK_SECONDS: NON_NEGATIVE, TUNE_COUNT: NON_NEGATIVE, TUNE_IMPORTANCE: SHARE,
    TUNE_CONFIRM: ANY,                       # the study's metric (an accuracy, steps, seconds), its difference, p
    SUMMARY_FINAL_ACC: ACCURACY, SUMMARY_GAIN: Domain(-1.0, 1.0, accuracy=True), SUMMARY_P_HOLM: SHARE,
    SUMMARY_POI: SHARE,
}

#: the objectives' own metrics (algorithms/; docs/METRICS.md, "objective/"), named here only for their values
OBJECTIVE_DOMAINS: dict[str, Domain] = {
    "objective/kl_term": ANY, "objective/entropy": NON_NEGATIVE,
    "objective/clip_frac_low": SHARE, "objective/clip_frac_high": SHARE,
    "objective/ratio_mean": NON_NEGATIVE, "objective/ratio_max": NON_NEGATIVE,
    "objective/masked_frac": SHARE, "objective/detached_frac": SHARE, "objective/selected_frac": SHARE,
    "objective/cov_selected": NON_NEGATIVE, "objective/dual_clip_frac": SHARE, "objective/vespo_weight_mean": ANY,
    "objective/taper_frac": SHARE, "objective/ratio_truncated_frac": SHARE, "objective/unbounded_frac": SHARE,
    "objective/mismatch_kl_k3": NON_NEGATIVE, "objective/mismatch_kl_k1": ANY,
    "objective/is_weight_mean": NON_NEGATIVE, "objective/is_weight_min": NON_NEGATIVE,
    "objective/is_weight_max": NON_NEGATIVE, "objective/is_cut_frac": SHARE,
    "objective/off_policy_masked_frac": SHARE, "objective/truncated_masked_frac": SHARE,
    "objective/entropy_coef": NON_NEGATIVE, "objective/entropy_coef_applied": NON_NEGATIVE,
}


def _pattern(template: str) -> re.Pattern:
    """A template name as a regular expression: a ``{field}`` is any text without a slash (a task: any text)."""
    parts = re.split(r"(\{\w+\})", template)
    return re.compile("".join((".+?" if p == "{task}" else "[^/]+") if re.fullmatch(r"\{\w+\}", p) else re.escape(p)
                              for p in parts))


def domain(key: str) -> Domain:
    """The values metric ``key`` can take (:class:`Domain`); :data:`ANY` for a name none of the tables declares."""
    found = DOMAINS.get(key) or OBJECTIVE_DOMAINS.get(key)
    if found is not None:
        return found
    return next((d for t, d in TEMPLATE_DOMAINS.items() if _pattern(t).fullmatch(key)), ANY)


def eval_key(task: str, metric: str) -> str:
    """``eval/<task>/<metric>`` (MLflow keys cannot hold '@': pass@k is written pass_at_k)."""
    return EVAL_TASK.format(task=task, metric=metric.replace("@", "_at_"))


def held_out_keys(task: str, sampled: bool, engine: str = "native") -> set[str]:
    """The ``eval/`` keys a training run's held-out evaluation reports (``bench.evaluate.eval_metrics``), known from
    its config before any work: ``task`` the held-out benchmark's name, ``sampled`` whether it also samples
    (``eval_temperature > 0`` and ``eval_samples > 0``: k = 1). verl reports only the two accuracies
    (bench/engines/verl/launch.py)."""
    keys = {EVAL_ACCURACY, *([EVAL_ACCURACY_SAMPLED] if sampled else [])}
    if engine == "verl":
        return keys
    for metric in ("greedy_acc", *(("pass@1", "maj@1") if sampled else ())):
        key = eval_key(task, metric)
        keys |= {key, f"{key}_ci_low", f"{key}_ci_high"}
    return keys


def names() -> dict[str, str]:
    """Every constant of this module: {python name: metric key}."""
    return {k: v for k, v in globals().items() if k.isupper() and isinstance(v, str) and "/" in v}
