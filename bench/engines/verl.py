"""verl engine: pobench objectives as verl policy losses, a comparison run's verl config, and its launch on Ray.

Three parts, each usable alone:

1. **Objectives** (``register_all``, run on import when verl is installed): every pobench objective is registered
   with verl's policy-loss registry (``verl.trainer.ppo.core_algos.register_policy_loss``) as ``pobench_<name>``.
   verl calls a registered loss as ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
   rollout_is_weights) -> (loss, metrics)`` (selected by ``actor_rollout_ref.actor.policy_loss.loss_mode``), and
   adds the KL to the reference and the entropy bonus itself, outside that function (``verl/workers/utils/losses.py``
   ``ppo_loss``). So an objective's β·KL (every token, unmasked) and α·H terms run as verl's own ``use_kl_loss`` /
   ``entropy_coeff`` and its registered loss is the objective with those two terms at 0; the advantage estimator,
   DAPO's dynamic sampling and overlong shaping run as verl's ``algorithm.adv_estimator``,
   ``algorithm.filter_groups`` and the ``dapo`` reward manager. An objective whose loss needs more than verl hands
   a policy loss (π_ref log-probs under a mask, current / reference / old entropies: TEPO's masked KL, forking
   tokens) would need the worker's loss function replaced (``set_loss_fn``) and a trainer that also computes the
   reference entropy; that is not built: such names are registered as stubs that raise with the reason, and
   ``make_verl_config`` refuses them. ``plan(name)`` says how one objective runs; ``objective_table()`` lists all.
   This module is importable as verl's ``actor_rollout_ref.model.external_lib`` (verl imports it in every worker);
   registration is idempotent.

2. **Config** (``make_verl_config``): the Hydra overrides of verl's ``ppo_trainer`` config for one run (objective,
   seed) of a pobench ``TrainConfig``; ``hydra_overrides`` flattens them into ``key=value`` arguments of
   ``python -m verl.trainer.main_ppo``. ``write_data`` converts a task's problems into verl's parquet layout, and
   ``compute_score`` is the reward function verl calls (pobench's own verifier).

3. **Launch** (``launch``; needs GPUs and a Ray cluster): creates the MLflow run with pobench's tags, runs verl with
   ``MLFLOW_RUN_ID`` set so verl's MLflow logger writes into it, then copies verl's metrics under pobench's names
   (``METRIC_MAP``) so ``bench report`` can read the run.

Entry point: ``python -m bench.engines.verl --algo NAME --seed N [--config run.yaml] --print-config|--launch``.
verl is imported lazily: without it, ``plan``, ``objective_table`` and ``make_verl_config`` still work.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from algorithms import PolicyBatch, get_objective, list_objectives
from algorithms.base import Objective
from algorithms.correction import BATCH_OPTIONS
from algorithms.policy_gradient import PolicyGradient
from algorithms.tepo import TEPOObjective

PREFIX = "pobench_"
#: JSON {objective: {field: value}}: config overrides the workers apply when they register the objectives (the
#: generated config puts it in Ray's runtime_env, so every worker sees the same objective as the driver)
OVERRIDES_ENV = "POBENCH_VERL_OBJECTIVE_OVERRIDES"
EXTERNAL_LIB = "bench.engines.verl"

# pobench advantage estimator -> (verl algorithm.adv_estimator, algorithm.norm_adv_by_std_in_grpo); parity of each
# pair is tested in tests/verl/test_verl_parity.py
ADV_ESTIMATORS: dict[str, tuple[str, bool]] = {
    "group": ("grpo", True), "group-no-std": ("grpo", False), "rloo": ("rloo", True),
    "reinforce++": ("reinforce_plus_plus", True), "reinforce++-baseline": ("reinforce_plus_plus_baseline", True),
    "grpo-passk": ("grpo_passk", True), "opo": ("opo", True), "gpg": ("gpg", True), "remax": ("remax", True),
}
# pobench KL estimator -> verl actor.kl_loss_type (verl's k3 'low_var_kl' clamps the per-token value to [-10, 10])
KL_TYPES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
ROLLOUT_ENGINES = ("vllm", "sglang")


# ------------------------------------------------------------------------------------------------ objectives
@dataclass(frozen=True)
class VerlPlan:
    """How one pobench objective (with its overrides) runs on verl."""

    objective: str
    mode: str  # "registered" | "worker-loss" | "unsupported"
    loss_overrides: dict = field(default_factory=dict)  # the registered loss = the objective with these overrides
    native: dict = field(default_factory=dict)  # verl config entries (dotted keys) the objective maps onto
    reason: str = ""  # why it does not run (worker-loss / unsupported)

    @property
    def loss_mode(self) -> str:
        return PREFIX + self.objective

    @property
    def runs(self) -> bool:
        return self.mode == "registered"

    def how(self) -> str:
        """One line for the objective table: the registered loss and the verl settings that are not verl's
        defaults for a GRPO-style run (KL, entropy bonus, estimator other than grpo with std, DAPO's hooks)."""
        if not self.runs:
            return f"{self.mode}: {self.reason}"
        quiet = {"actor_rollout_ref.actor.use_kl_loss": False, "actor_rollout_ref.actor.entropy_coeff": 0.0,
                 "algorithm.norm_adv_by_std_in_grpo": True}
        items = [f"{k.replace('actor_rollout_ref.', '')}={v}" for k, v in self.native.items() if quiet.get(k, ...) != v]
        return f"registered loss `{self.loss_mode}`; verl: " + ", ".join(items)


def _probe(objective: Objective) -> list[str]:
    """The PolicyBatch fields the objective's loss needs beyond what verl hands a policy loss (empty: none)."""
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(2, 3, generator=g, dtype=torch.float64) - 0.1
    extra: dict[str, torch.Tensor] = {}
    while True:
        batch = PolicyBatch(logprobs=lp, old_logprobs=lp + 0.1, advantages=torch.tensor([1.0, -1.0], dtype=lp.dtype),
                            mask=torch.ones(2, 3, dtype=lp.dtype), max_length=3, **extra)
        try:
            objective.loss(batch, generator=g)
            return list(extra)
        except ValueError as e:
            m = re.search(r"needs PolicyBatch\.(\w+)", str(e))
            if not m or m.group(1) in extra:
                raise
            extra[m.group(1)] = torch.ones_like(lp)


def plan(name: str, overrides: dict | None = None, *, max_length: int | None = None) -> VerlPlan:
    """How objective ``name`` (with config ``overrides``) runs on verl. ``max_length``: L_max, for DAPO's overlong
    buffer length."""
    objective = get_objective(name, **dict(overrides or {}))
    c = objective.config
    loss_over: dict[str, Any] = {}
    native: dict[str, Any] = {"actor_rollout_ref.actor.loss_agg_mode": c.aggregation}

    def no(mode: str, why: str) -> VerlPlan:
        return VerlPlan(name, mode, reason=why)

    for key, off in BATCH_OPTIONS.items():
        if getattr(c, key) != off:
            return no("unsupported", f"{key}={getattr(c, key)!r}: verl hands a policy loss its own rollout-correction "
                                     "weights, not the sampler log-probs / truncation flags pobench's batch options "
                                     "read (use verl's algorithm.rollout_correction instead)")
    if c.advantage_estimator not in ADV_ESTIMATORS:
        return no("unsupported", f"advantage estimator {c.advantage_estimator!r} has no verl counterpart")
    est, norm = ADV_ESTIMATORS[c.advantage_estimator]
    native["algorithm.adv_estimator"] = est
    if est == "grpo":
        native["algorithm.norm_adv_by_std_in_grpo"] = norm
    kl_coef = getattr(c, "kl_coef", 0.0)
    native_kl = False
    if isinstance(objective, PolicyGradient) and kl_coef > 0:
        if c.kl_is_correction:
            return no("unsupported", "kl_is_correction (r·KL): verl's KL loss has no importance-ratio factor")
        native_kl = True
    if isinstance(objective, TEPOObjective) and kl_coef > 0 and c.kl_mask == "all" and c.kl_target == "ref":
        native_kl = True  # M ≡ 1: the masked KL is verl's plain KL loss
    if native_kl:
        loss_over["kl_coef"] = 0.0
        native.update({"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_coef": kl_coef,
                       "actor_rollout_ref.actor.kl_loss_type": KL_TYPES[c.kl_estimator]})
    else:
        native["actor_rollout_ref.actor.use_kl_loss"] = False
    entropy_coef = getattr(c, "entropy_coef", 0.0)
    if entropy_coef > 0:
        loss_over["entropy_coef"] = 0.0
    native["actor_rollout_ref.actor.entropy_coeff"] = entropy_coef
    if c.aggregation == "seq-mean-token-sum-norm":
        native["actor_rollout_ref.actor.loss_scale_factor"] = max_length or "L_max"  # Dr. GRPO's constant
    if c.dynamic_sampling:
        native.update({"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc",
                       "algorithm.filter_groups.max_num_gen_batches": c.max_sampling_rounds})
    if c.overlong_shaping:
        cache = max(1, round(c.overlong_buffer_frac * max_length)) if max_length else f"{c.overlong_buffer_frac}·L_max"
        native.update({"reward.reward_manager.name": "dapo",
                       "reward.reward_kwargs.overlong_buffer_cfg": {"enable": True, "len": cache,
                                                                    "penalty_factor": 1.0, "log": True},
                       "reward.reward_kwargs.max_resp_len": max_length or "L_max"})
    missing = _probe(get_objective(name, **{**dict(overrides or {}), **loss_over}))
    if missing:
        return no("worker-loss", f"the loss needs {', '.join(missing)}, which verl does not hand a policy loss "
                                 "(needs set_loss_fn with a replaced worker loss and, for H_ref, a trainer that "
                                 "computes the reference entropy: not built)")
    return VerlPlan(name, "registered", loss_over, native)


def objective_table(names: list[str] | None = None) -> list[VerlPlan]:
    """The plan of every registered objective (registry defaults), in registration order."""
    return [plan(n) for n in (names or list_objectives())]


def table_markdown(plans: list[VerlPlan] | None = None) -> str:
    rows = ["| objective | on verl |", "|---|---|"]
    rows += [f"| `{p.objective}` | {p.how()} |" for p in (plans or objective_table())]
    return "\n".join(rows)


def _env_overrides() -> dict[str, dict]:
    raw = os.environ.get(OVERRIDES_ENV, "").strip()
    if not raw:
        return {}
    data = json.loads(raw)
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{OVERRIDES_ENV} must be a JSON object {{objective: {{field: value}}}}, got {raw[:200]!r}")
    return data


def _global_scale(aggregation: str, mask: torch.Tensor, config) -> torch.Tensor | float:
    """Factor that turns the objective's micro-batch loss into its share of the global mini-batch loss, as verl's
    ``agg_loss`` normalises (``config.global_batch_info``: dp_size, batch_num_tokens, global_batch_size): summed
    over micro-batches and averaged over data-parallel ranks, the shares give the mini-batch loss."""
    info = dict(getattr(config, "global_batch_info", None) or {}) if config is not None else {}
    dp = int(info.get("dp_size") or 1)
    if aggregation == "token-mean":
        total = info.get("batch_num_tokens")
        if total is None:
            if dp > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            return 1.0
        return mask.sum() / float(total) * dp
    rows = mask.shape[0]
    total = info.get("global_batch_size")
    if total is None:
        if dp > 1:
            raise ValueError("global_batch_size is required when dp_size > 1")
        total = float((mask.sum(-1) > 0).sum().clamp(min=1))  # verl: fully masked sequences do not count
    return rows / float(total) * dp


def _check_config(p: VerlPlan, loss_agg_mode: str, config) -> None:
    """Refuse a verl config that does not run the objective as planned (aggregation, KL, entropy bonus)."""
    want = p.native["actor_rollout_ref.actor.loss_agg_mode"]
    if loss_agg_mode != want:
        raise ValueError(f"verl loss_agg_mode={loss_agg_mode!r} but pobench objective {p.objective!r} aggregates with "
                         f"{want!r}: set actor_rollout_ref.actor.loss_agg_mode={want} (make_verl_config does)")
    if config is None:
        return
    for key, value in p.native.items():
        section, _, attr = key.rpartition(".")
        if section != "actor_rollout_ref.actor" or attr in ("loss_agg_mode", "loss_scale_factor"):
            continue
        if attr in ("kl_loss_coef", "kl_loss_type") and not p.native.get("actor_rollout_ref.actor.use_kl_loss"):
            continue
        have = getattr(config, attr, None)
        if have != value and not (isinstance(value, float) and isinstance(have, (int, float))
                                  and abs(have - value) <= 1e-12 * max(1.0, abs(value))):
            raise ValueError(f"pobench objective {p.objective!r} runs with verl {key}={value!r}, but the actor "
                             f"config has {attr}={have!r} (make_verl_config sets it)")


def make_policy_loss(name: str, overrides: dict | None = None):
    """verl policy-loss function for objective ``name``: builds a ``PolicyBatch`` from verl's tensors and returns the
    objective's loss, scaled to verl's global-batch normalisation, and its metrics."""
    p = plan(name, overrides)
    if not p.runs:
        def refuse(*args, **kwargs):
            raise ValueError(f"pobench objective {name!r} does not run as a verl policy loss ({p.mode}): {p.reason}")
        return refuse
    objective = get_objective(name, **{**dict(overrides or {}), **p.loss_overrides})
    aggregation = objective.config.aggregation

    def policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                    response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                    rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        _check_config(p, loss_agg_mode, config)
        if rollout_is_weights is not None:
            raise ValueError(f"pobench objective {name!r}: verl's rollout-correction weights are not applied by "
                             "pobench losses; turn algorithm.rollout_correction off")
        mask = response_mask.to(log_prob.dtype)
        # outcome rewards: one advantage per completion, broadcast by verl over its tokens
        adv = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        scale = getattr(config, "loss_scale_factor", None) if config is not None else None
        max_length = int(scale) if scale else mask.shape[-1]  # verl's seq-mean-token-sum-norm constant
        batch = PolicyBatch(logprobs=log_prob, old_logprobs=old_log_prob.to(log_prob.dtype), advantages=adv,
                            mask=mask, max_length=max_length)
        loss, metrics = objective.loss(batch)
        loss = loss * _global_scale(aggregation, mask, config)
        return loss, {k: float(v) for k, v in metrics.items()}

    policy_loss.__name__ = policy_loss.__qualname__ = f"{PREFIX}{name}"
    policy_loss.__doc__ = f"pobench objective {name!r} as a verl policy loss (bench/engines/verl.py)."
    return policy_loss


def register_all() -> list[str]:
    """Register every pobench objective with verl as ``pobench_<name>`` (overrides from ``$POBENCH_VERL_OBJECTIVE_
    OVERRIDES``); objectives that cannot run get a stub that raises with the reason. Idempotent. Returns the names."""
    from verl.trainer.ppo.core_algos import register_policy_loss

    env = _env_overrides()
    names = []
    for name in list_objectives():
        register_policy_loss(PREFIX + name)(make_policy_loss(name, env.get(name)))
        names.append(PREFIX + name)
    return names


# ------------------------------------------------------------------------------------------------ data and reward
def _chat_template(template: str) -> str | None:
    """A Jinja chat template that renders pobench's prompt ``template`` around the user message (None: the tokenizer's
    own chat template, what pobench's ``chat`` / ``auto`` use)."""
    from bench.model import PLAIN_TEMPLATE

    if template in ("auto", "chat"):
        return None
    if template == "plain":
        template = PLAIN_TEMPLATE
    if "{question}" not in template:
        raise ValueError(f"prompt template {template!r} must be auto, chat, plain, or a string containing {{question}}")
    before, after = template.split("{question}", 1)
    # string literals in expression tags: no block tag, so trim_blocks / lstrip_blocks (Hugging Face's chat-template
    # environment) cannot eat a newline or an indent of the literal text
    literal = [f"{{{{ {json.dumps(t, ensure_ascii=False)} }}}}" if t else "" for t in (before, after)]
    return literal[0] + "{{ messages[-1]['content'] }}" + literal[1]


def problem_rows(benchmark_name: str, problems, answer_kind: str, split: str) -> list[dict]:
    """verl's RLHF dataset rows (data_source, prompt messages, reward_model.ground_truth, extra_info)."""
    return [{"data_source": benchmark_name, "prompt": [{"role": "user", "content": p.question}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": p.answer},
             "extra_info": {"split": split, "index": i, "id": p.id, "answer_kind": answer_kind}}
            for i, p in enumerate(problems)]


def write_data(cfg, out_dir: str | Path) -> tuple[Path, Path]:
    """Write the training split of ``cfg.task`` and ``cfg.eval_problems`` held-out problems of ``cfg.eval_task`` as
    verl parquet files (``train.parquet``, ``val.parquet``) under ``out_dir``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.data import eval_problems
    from evaluators import get_benchmark

    if cfg.task == "arith":
        raise ValueError("task arith is pobench's built-in toy task: verl runs need a benchmark with files")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_bench = get_benchmark(cfg.task)
    train = train_bench.load(split="train", data=cfg.data, skip_bad_rows=cfg.skip_bad_rows)
    eval_bench, held_out = eval_problems(cfg.eval_task or cfg.task, limit=cfg.eval_problems, data=cfg.eval_data,
                                         skip_bad_rows=cfg.skip_bad_rows)
    paths = out / "train.parquet", out / "val.parquet"
    for path, name, kind, problems, split in ((paths[0], cfg.task, train_bench.answer_kind, train, "train"),
                                              (paths[1], cfg.eval_task or cfg.task, eval_bench.answer_kind, held_out,
                                               "test")):
        pq.write_table(pa.Table.from_pylist(problem_rows(name, problems, kind, split)), path)
    return paths


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **_: Any) -> dict[str, float]:
    """verl's custom reward function: pobench's verifier (1 / 0), as ``score`` and as ``acc`` (the metric DAPO's
    group filter and verl's validation read)."""
    from evaluators import get_benchmark
    from evaluators.verify import is_correct

    kind = (extra_info or {}).get("answer_kind") or get_benchmark(data_source).answer_kind
    r = 1.0 if is_correct(solution_str, str(ground_truth), kind) else 0.0
    return {"score": r, "acc": r}


# ------------------------------------------------------------------------------------------------ config
@dataclass
class VerlOptions:
    """What verl needs that pobench's TrainConfig does not say (the cluster, the rollout engine's sharding)."""

    rollout_engine: str = "vllm"  # vllm | sglang
    nnodes: int = 1
    n_gpus_per_node: int = 8
    tensor_parallel: int = 1  # rollout tensor-parallel size
    gpu_memory_utilization: float = 0.5
    max_prompt_length: int = 1024
    data_dir: str | None = None  # where write_data puts the parquet files (default: <output_dir>/<run>/verl-data)


def run_name(cfg) -> str:
    return cfg.run_name or f"{cfg.algo}-s{cfg.seed}"


def make_verl_config(cfg, options: VerlOptions | None = None) -> dict[str, Any]:
    """The overrides of verl's ``ppo_trainer`` config for the run (``cfg.algo``, ``cfg.seed``) of a pobench
    ``TrainConfig`` (nested dict; ``hydra_overrides`` flattens it for ``python -m verl.trainer.main_ppo``).

    Raises ValueError for what verl cannot run as pobench defines it (objective plan, built-in model / task, the
    random-reward control, a linear LR schedule, prompts_per_step not divisible by minibatches)."""
    o = options or VerlOptions()
    cfg.validate()
    p = plan(cfg.algo, cfg.objective_overrides, max_length=cfg.max_new_tokens)
    if not p.runs:
        raise ValueError(f"objective {cfg.algo!r} does not run on verl ({p.mode}): {p.reason}")
    if cfg.model.startswith("builtin:"):
        raise ValueError(f"model {cfg.model!r} is pobench's built-in toy model: verl needs a Hugging Face model")
    if cfg.control is not None:
        raise ValueError(f"control {cfg.control!r} is not implemented on verl")
    if cfg.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"lr_schedule {cfg.lr_schedule!r}: verl offers constant and cosine")
    if cfg.prompts_per_step % cfg.minibatches:
        raise ValueError(f"prompts_per_step={cfg.prompts_per_step} must be a multiple of minibatches="
                         f"{cfg.minibatches}: verl's mini-batches are whole prompts with their group")
    if o.rollout_engine not in ROLLOUT_ENGINES:
        raise ValueError(f"rollout engine {o.rollout_engine!r}: valid: {', '.join(ROLLOUT_ENGINES)}")
    name = run_name(cfg)
    run_dir = Path(cfg.output_dir).resolve() / name
    data_dir = Path(o.data_dir).resolve() if o.data_dir else run_dir / "verl-data"
    micro = min(cfg.micro_batch_size, cfg.prompts_per_step // cfg.minibatches * cfg.group_size)
    env = {OVERRIDES_ENV: json.dumps({cfg.algo: dict(cfg.objective_overrides)}, sort_keys=True),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # pobench's source tree, for external_lib
    out: dict[str, Any] = {
        "data": {"train_files": str(data_dir / "train.parquet"), "val_files": str(data_dir / "val.parquet"),
                 "train_batch_size": cfg.prompts_per_step, "max_prompt_length": o.max_prompt_length,
                 "max_response_length": cfg.max_new_tokens, "shuffle": True, "seed": cfg.seed,
                 "filter_overlong_prompts": True, "truncation": "error"},
        "actor_rollout_ref": {
            "model": {"path": cfg.model, "external_lib": EXTERNAL_LIB,
                      "enable_gradient_checkpointing": cfg.activation_checkpointing,
                      "lora_rank": cfg.lora_rank, "lora_alpha": cfg.lora_alpha,
                      **({"target_modules": list(cfg.lora_target_modules)} if cfg.lora_rank else {}),
                      **({"custom_chat_template": _chat_template(cfg.prompt_template)}
                         if _chat_template(cfg.prompt_template) else {})},
            "actor": {
                "optim": {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "betas": list(cfg.adam_betas),
                          "clip_grad": cfg.max_grad_norm if cfg.max_grad_norm > 0 else 1.0e9,
                          "lr_warmup_steps": cfg.warmup_steps, "lr_scheduler_type": cfg.lr_schedule},
                "ppo_mini_batch_size": cfg.prompts_per_step // cfg.minibatches,
                "ppo_micro_batch_size_per_gpu": micro, "ppo_epochs": cfg.update_epochs, "shuffle": False,
                "data_loader_seed": cfg.seed,
                "policy_loss": {"loss_mode": p.loss_mode},
                "fsdp_config": {"seed": cfg.seed},
            },
            "rollout": {"name": o.rollout_engine, "n": cfg.group_size, "temperature": cfg.temperature,
                        "top_p": cfg.top_p, "seed": cfg.seed, "tensor_model_parallel_size": o.tensor_parallel,
                        "gpu_memory_utilization": o.gpu_memory_utilization,
                        "log_prob_micro_batch_size_per_gpu": micro,
                        "val_kwargs": {"temperature": cfg.eval_temperature, "n": cfg.eval_samples,
                                       "do_sample": cfg.eval_temperature > 0}},
            "ref": {"log_prob_micro_batch_size_per_gpu": micro},
        },
        "algorithm": {"use_kl_in_reward": False},
        "reward": {"custom_reward_function": {"path": str(Path(__file__).resolve()), "name": "compute_score"}},
        "trainer": {"total_training_steps": cfg.steps, "total_epochs": 1000, "project_name": cfg.experiment,
                    "experiment_name": name, "logger": ["console", "mlflow"], "nnodes": o.nnodes,
                    "n_gpus_per_node": o.n_gpus_per_node, "val_before_train": cfg.eval_every > 0,
                    "test_freq": cfg.eval_every if cfg.eval_every > 0 else -1,
                    "save_freq": cfg.checkpoint_every if cfg.checkpoint_every > 0 else cfg.steps,
                    "max_actor_ckpt_to_keep": cfg.keep_checkpoints, "default_local_dir": str(run_dir / "verl"),
                    "resume_mode": "auto" if cfg.resume else "disable"},
        "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": env}}},
    }
    native = dict(p.native)
    if native.get("actor_rollout_ref.actor.loss_scale_factor") is not None:
        native["actor_rollout_ref.actor.loss_scale_factor"] = cfg.max_new_tokens
    for key, value in native.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    c = get_objective(cfg.algo, **cfg.objective_overrides).config
    # shown in the config verl logs; the pobench loss reads its own clip range
    if hasattr(c, "clip_low") and hasattr(c, "clip_high"):
        out["actor_rollout_ref"]["actor"].update({"clip_ratio_low": c.clip_low, "clip_ratio_high": c.clip_high})
    return out


#: keys under these prefixes are not in verl's ppo_trainer config: Hydra adds them (``+key=value``)
ADDED_PREFIXES = ("ray_kwargs.ray_init.runtime_env.env_vars", "reward.reward_kwargs")


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _hydra_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(x)}" for k, x in v.items()) + "}"
    s = str(v)
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def hydra_overrides(config: dict[str, Any]) -> list[str]:
    """``key=value`` command-line overrides of verl's ppo_trainer config (``+key=value`` for keys it lacks)."""
    env = ADDED_PREFIXES[0]
    return [("+" if k.startswith(ADDED_PREFIXES) else "") + f"{k}=" + _hydra_value(str(v) if k.startswith(env) else v)
            for k, v in _flatten(config).items()]


def main_ppo_command(config: dict[str, Any], python: str = sys.executable) -> list[str]:
    return [python, "-m", "verl.trainer.main_ppo", *hydra_overrides(config)]


# ------------------------------------------------------------------------------------------------ MLflow
#: verl metric -> pobench metric (docs/METRICS.md), copied into the run after it ends by ``translate_metrics``
METRIC_MAP = {
    "critic/score/mean": "rollout/reward_mean",
    "response_length/mean": "rollout/length_mean",
    "response_length/max": "rollout/length_max",
    "response_length/clip_ratio": "rollout/truncation_rate",
    "actor/entropy": "rollout/entropy_mean",
    "actor/pg_loss": "objective/policy_loss",
    "actor/grad_norm": "train/grad_norm",
    "actor/lr": "train/lr",
    "actor/kl_loss": "train/kl_ref",
    "timing_s/gen": "time/rollout_s",
    "timing_s/update_actor": "time/update_s",
    "timing_s/step": "time/step_s",
}
#: validation metrics: val-core/<data_source>/acc/mean@1 -> eval/accuracy (greedy when eval_temperature = 0)
VAL_PATTERN = re.compile(r"^val-core/(?P<source>[^/]+)/acc/mean@(?P<n>\d+)$")


def pobench_tags(cfg) -> dict[str, str]:
    """The tags bench/train.py gives a run, plus ``pobench.engine=verl``."""
    from bench.tracking import version_tags

    return {"pobench.kind": "train", "pobench.engine": "verl", "pobench.objective": cfg.algo,
            "pobench.seed": str(cfg.seed), "pobench.config_hash": cfg.comparison_hash(), **version_tags(),
            "pobench.model": cfg.model, "pobench.task": cfg.task, "pobench.control": cfg.control or "none",
            **({"pobench.comparison": cfg.comparison} if cfg.comparison else {}),
            **{k: str(v) for k, v in cfg.tags.items()}}


def translate_metrics(client, run_id: str, eval_source: str | None = None) -> int:
    """Copy verl's metrics of ``run_id`` under pobench's names (METRIC_MAP, VAL_PATTERN); also ``time/elapsed_s``
    (cumulative ``time/step_s``). Returns the number of points written."""
    from mlflow.entities import Metric

    from reports import record

    run = client.get_run(run_id)
    points: list[Metric] = []
    for key in run.data.metrics:
        target = METRIC_MAP.get(key)
        m = VAL_PATTERN.match(key)
        if m and (eval_source is None or m["source"] == eval_source):
            target = "eval/accuracy" if m["n"] == "1" else "eval/accuracy_sampled"
        if target is None:
            continue
        history = sorted(client.get_metric_history(run_id, key), key=lambda x: x.step)
        points += [Metric(target, h.value, h.timestamp, h.step) for h in history]
        if target == "time/step_s":
            total = 0.0
            for h in history:
                total += h.value
                points.append(Metric("time/elapsed_s", total, h.timestamp, h.step))
    for i in range(0, len(points), 1000):
        record.log_batch(client, run_id, metrics=points[i:i + 1000])
    return len(points)


# ------------------------------------------------------------------------------------------------ launch
def launch(cfg, options: VerlOptions | None = None, *, dry_run: bool = False, python: str = sys.executable) -> int:
    """Run one (objective, seed) of a comparison on verl (needs verl, GPUs, and a Ray cluster: ``RAY_ADDRESS`` or a
    local one). Writes the parquet data, creates the MLflow run with pobench's tags, runs ``verl.trainer.main_ppo``
    attached to it (``MLFLOW_RUN_ID``), then copies verl's metrics under pobench's names. Returns verl's exit code.
    ``dry_run``: print the command instead of running anything."""
    config = make_verl_config(cfg, options)
    command = main_ppo_command(config, python)
    if dry_run:
        print(shlex.join(command))
        return 0
    write_data(cfg, Path(config["data"]["train_files"]).parent)
    from bench.tracking import RunLogger, flatten

    logger = RunLogger(cfg.tracking_uri, cfg.experiment)
    run_id = logger.start(run_name(cfg), pobench_tags(cfg), flatten(cfg.to_dict()))
    env_vars = config["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    env_vars.update({"MLFLOW_TRACKING_URI": logger.uri, "MLFLOW_RUN_ID": run_id})
    command = main_ppo_command(config, python)
    env = {**os.environ, **env_vars}
    rc = subprocess.call(command, env=env)
    translate_metrics(logger.client, run_id, eval_source=cfg.eval_task or cfg.task)
    if rc:
        logger.set_tags({"pobench.failure": f"verl main_ppo exited with {rc}"})
    logger.end("FINISHED" if rc == 0 else "FAILED")
    return rc


def main(argv: list[str] | None = None) -> int:
    from bench.config import TrainConfig

    ap = argparse.ArgumentParser(prog="python -m bench.engines.verl", description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", help="objective (bench list)")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--config", help="pobench run config (YAML of TrainConfig fields)")
    for f in dataclasses.fields(VerlOptions):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default) if f.default is not None else str,
                        default=f.default)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--print-config", action="store_true", help="print the verl overrides (YAML) and the command")
    what.add_argument("--launch", action="store_true", help="write the data, run verl, translate the metrics")
    what.add_argument("--table", action="store_true", help="print how every objective runs on verl (Markdown)")
    args = ap.parse_args(argv)
    if args.table:
        print(table_markdown())
        return 0
    if args.algo is None or args.seed is None:
        ap.error("--algo and --seed are required with --print-config / --launch")
    over = {"algo": args.algo, "seed": args.seed}
    if args.config and not Path(args.config).is_file():
        ap.error(f"--config {args.config}: no such file")
    try:
        cfg = TrainConfig.load(args.config, **over) if args.config else TrainConfig(**over)
    except ValueError as e:  # an invalid field or value, named by the config's own check
        ap.error(str(e))
    options = VerlOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(VerlOptions)})
    try:
        if args.print_config:
            import yaml

            print(yaml.safe_dump(make_verl_config(cfg, options), sort_keys=False), end="")
            print("# command:\n# " + shlex.join(main_ppo_command(make_verl_config(cfg, options))))
            return 0
        return launch(cfg, options)
    except ValueError as e:
        print(f"bench.engines.verl: error: {e}", file=sys.stderr)
        return 2


try:  # registration on import (verl's external_lib); without verl the config part still works
    import verl.trainer.ppo.core_algos  # noqa: F401
except ImportError:
    pass
else:
    register_all()

if __name__ == "__main__":
    sys.exit(main())
