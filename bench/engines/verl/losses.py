"""pobench objectives as verl policy losses: how each objective runs on verl (``mapping``), the registered
loss functions and their registration (part 1 of the package docstring)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from algorithms import batch_for, get_objective, list_objectives
from algorithms.correction import BATCH_OPTIONS

PREFIX = "pobench_"
#: JSON {objective: {field: value}}: config overrides the workers apply when they register the objectives (the
#: generated config puts it in Ray's runtime_env, so every worker sees the same objective as the driver)
OVERRIDES_ENV = "POBENCH_VERL_OBJECTIVE_OVERRIDES"
EXTERNAL_LIB = "bench.engines.verl"
#: what pobench's worker loss hands an objective beyond what verl hands a policy loss (worker_loss.py)
WORKER_FIELDS = ("entropy", "old_entropy", "ref_logprobs", "ref_entropy")
#: verl's V1 trainer that pobench registers (trainer.v1.trainer_mode), and the module that registers it: verl imports
#: the modules named in $VERL_USE_EXTERNAL_MODULES on ``import verl``, in every process of the run
TRAINER_MODE = "pobench_sync"
TRAINER_MODULE = "bench.engines.verl.trainer"

# pobench advantage estimator -> (verl algorithm.adv_estimator, algorithm.norm_adv_by_std_in_grpo); parity of each
# pair is tested in tests/verl/test_verl_parity.py
ADV_ESTIMATORS: dict[str, tuple[str, bool]] = {
    "group": ("grpo", True), "group-no-std": ("grpo", False), "rloo": ("rloo", True),
    "reinforce++": ("reinforce_plus_plus", True), "reinforce++-baseline": ("reinforce_plus_plus_baseline", True),
    "grpo-passk": ("grpo_passk", True), "opo": ("opo", True), "gpg": ("gpg", True), "remax": ("remax", True),
}
# pobench per-token estimator (algorithms.advantages.TOKEN_ESTIMATORS) -> verl algorithm.adv_estimator; parity tested in
# tests/verl/test_verl_token_baseline.py. Not in ADV_ESTIMATORS: an objective that selects one runs on the native engine
# only (``mapping`` says unsupported, with TOKEN_ADV_WHY): pobench's loss on verl averages verl's per-token advantages
# over each completion (``make_policy_loss``, worker_loss.py), which would turn their baseline into another one without
# a word. Running them also needs verl's actor.calculate_sum_pi_squared=True (Σπ² of π_old at every token).
TOKEN_ADV_ESTIMATORS: dict[str, str] = {"optimal-token-baseline": "optimal_token_baseline",
                                        "tir-optimal-token-baseline": "tir_optimal_token_baseline"}
TOKEN_ADV_WHY = ("pobench's loss on verl averages verl's per-token advantages over each completion, which would "
                 "replace the per-token baseline B_t by its mean (use --engine native)")
# pobench KL estimator -> verl actor.kl_loss_type (verl's k3 'low_var_kl' clamps the per-token value to [-10, 10])
KL_TYPES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
ROLLOUT_ENGINES = ("vllm", "sglang")


# ------------------------------------------------------------------------------------------------ objectives
@dataclass(frozen=True)
class VerlMapping:
    """How one pobench objective (with its overrides) runs on verl."""

    objective: str
    mode: str  # "registered" | "worker-loss" | "unsupported"
    loss_overrides: dict = field(default_factory=dict)  # the registered loss = the objective with these overrides
    native: dict = field(default_factory=dict)  # verl config entries (dotted keys) the objective maps onto
    reason: str = ""  # why it does not run (unsupported) / needs the worker loss (worker-loss)

    @property
    def loss_mode(self) -> str:
        return PREFIX + self.objective

    @property
    def runs(self) -> bool:
        return self.mode in ("registered", "worker-loss")

    def how(self) -> str:
        """One line for the objective table: the loss and the verl settings that are not verl's defaults for a
        GRPO-style run (KL, entropy bonus, estimator other than grpo with std, DAPO's hooks)."""
        if not self.runs:
            return f"{self.mode}: {self.reason}"
        quiet = {"actor_rollout_ref.actor.use_kl_loss": False, "actor_rollout_ref.actor.entropy_coeff": 0.0,
                 "algorithm.norm_adv_by_std_in_grpo": True, "actor_rollout_ref.actor.calculate_entropy": False,
                 "trainer.use_v1": True, "trainer.v1.trainer_mode": TRAINER_MODE}
        if self.mode == "worker-loss":
            quiet["actor_rollout_ref.actor.kl_loss_coef"] = 0.0
        items = [f"{k.replace('actor_rollout_ref.', '')}={v}" for k, v in self.native.items() if quiet.get(k, ...) != v]
        if self.mode == "worker-loss":
            return (f"worker loss `{self.loss_mode}` ({self.reason}), trainer `{TRAINER_MODE}`; verl: "
                    + ", ".join(items))
        return f"registered loss `{self.loss_mode}`; verl: " + ", ".join(items)


def mapping(name: str, overrides: dict | None = None, *, max_length: int | None = None) -> VerlMapping:
    """How objective ``name`` (with config ``overrides``) runs on verl. ``max_length``: L_max, for DAPO's overlong
    buffer length."""
    objective = get_objective(name, **dict(overrides or {}))
    c = objective.config
    native: dict[str, Any] = {"actor_rollout_ref.actor.loss_agg_mode": c.aggregation}

    def no(mode: str, why: str) -> VerlMapping:
        return VerlMapping(name, mode, reason=why)

    if objective.critic is not None:
        return no("unsupported", "it trains pobench's critic for per-token GAE advantages; verl's own critic "
                                 "(adv_estimator=gae) is not wired to pobench's objective")
    if objective.initial_state():
        return no("unsupported", f"it carries state across optimizer steps ({', '.join(sorted(objective.state))}: "
                                 "e.g. the adaptive entropy coefficient of entropy_target > 0), which verl's actor "
                                 "neither advances nor checkpoints")
    for key, off in BATCH_OPTIONS.items():
        if getattr(c, key) != off:
            return no("unsupported", f"{key}={getattr(c, key)!r}: verl hands a policy loss its own rollout-correction "
                                     "weights, not the sampler log-probs / truncation flags pobench's batch options "
                                     "read (use verl's algorithm.rollout_correction instead)")
    if c.advantage_estimator in TOKEN_ADV_ESTIMATORS:
        return no("unsupported", f"per-token advantage estimator {c.advantage_estimator!r}: {TOKEN_ADV_WHY}")
    if objective.needs_whole_groups:
        return no("unsupported", "its loss couples the completions of a group (a softmax over each group's sequence "
                                 "log-probs: needs_whole_groups), and verl's actor splits and shuffles a batch into "
                                 "micro-batches without a group index")
    if objective.token_advantage_needs:
        return no("unsupported", f"its per-token advantages need {', '.join(objective.token_advantage_needs)} over "
                                 "whole groups after a scoring pass of the sampling policy (advantages_from_token_"
                                 "stats), which verl's trainer neither computes nor hands a policy loss")
    if "reward_components" in objective.advantage_needs:
        return no("unsupported", f"advantage estimator {c.advantage_estimator!r} reads the reward's components "
                                 "(outcome, answer format, overlong penalty), and pobench's verl reward function "
                                 "returns one score: verl's gdpo would need them as reward_extra_info keys named in "
                                 "algorithm.gdpo_reward_keys (use --engine native)")
    if c.advantage_estimator not in ADV_ESTIMATORS:
        return no("unsupported", f"advantage estimator {c.advantage_estimator!r} has no verl counterpart")
    est, norm = ADV_ESTIMATORS[c.advantage_estimator]
    native["algorithm.adv_estimator"] = est
    if est == "grpo":
        native["algorithm.norm_adv_by_std_in_grpo"] = norm
    later: dict[str, Any] = {}  # rollout-side settings, the same for both kinds of loss
    if c.aggregation == "seq-mean-token-sum-norm":
        later["actor_rollout_ref.actor.loss_scale_factor"] = max_length or "L_max"  # Dr. GRPO's constant
    if c.dynamic_sampling:
        later.update({"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc",
                      "algorithm.filter_groups.max_num_gen_batches": c.max_sampling_rounds})
    if c.overlong_shaping:
        cache = max(1, round(c.overlong_buffer_frac * max_length)) if max_length else f"{c.overlong_buffer_frac}·L_max"
        later.update({"reward.reward_manager.name": "dapo",
                      "reward.reward_kwargs.overlong_buffer_cfg": {"enable": True, "len": cache,
                                                                   "penalty_factor": 1.0, "log": True},
                      "reward.reward_kwargs.max_resp_len": max_length or "L_max"})

    # 1. a registered policy loss: the objective with its plain β·KL and α·H moved to verl's own options
    kl_coef = getattr(c, "kl_coef", 0.0)
    # the objective's KL term runs as verl's KL loss (no factor, no mask, the reference as target) when the objective
    # declares it is exactly that ("native"); any other KL term stays inside the loss, which then needs its fields
    kl_term = "native" if kl_coef > 0 and objective.separable_kl else ""
    entropy_coef = getattr(c, "entropy_coef", 0.0)
    loss_over = {**({"kl_coef": 0.0} if kl_term == "native" else {}),
                 **({"entropy_coef": 0.0} if entropy_coef > 0 else {})}
    if not get_objective(name, **{**dict(overrides or {}), **loss_over}).batch_fields:
        if kl_term == "native":
            native.update({"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_coef": kl_coef,
                           "actor_rollout_ref.actor.kl_loss_type": KL_TYPES[c.kl_estimator]})
        else:
            native["actor_rollout_ref.actor.use_kl_loss"] = False
        native["actor_rollout_ref.actor.entropy_coeff"] = entropy_coef
        return VerlMapping(name, "registered", loss_over, {**native, **later})

    # 2. pobench's worker loss: the whole objective (its KL and entropy terms included) replaces verl's ppo_loss, and
    # pobench's trainer puts H_old and H_ref into the batch (bench/engines/verl/worker_loss.py, trainer.py)
    needs = sorted(objective.batch_fields)  # (the objective's own declaration of what its loss reads)
    unsupplied = [f for f in needs if f not in WORKER_FIELDS]
    if unsupplied:
        return no("unsupported", f"the loss needs {', '.join(unsupplied)}, which neither verl's policy loss nor "
                                 "pobench's worker loss hands it")
    r_kl = kl_coef > 0 and getattr(c, "kl_is_correction", False)
    why = f"needs {', '.join(needs)}" + (", r·KL: verl's KL loss has no importance-ratio factor" if r_kl
                                         else ": verl does not hand them a policy loss")
    native.update({
        # use_kl_loss only makes verl build the reference worker (need_reference_policy); the KL term is pobench's
        "actor_rollout_ref.actor.use_kl_loss": objective.needs_reference or any(f.startswith("ref_") for f in needs),
        "actor_rollout_ref.actor.kl_loss_coef": 0.0, "actor_rollout_ref.actor.entropy_coeff": 0.0,
        "actor_rollout_ref.actor.calculate_entropy": "entropy" in needs or objective.needs_entropy_grad,
        **later, "trainer.use_v1": True, "trainer.v1.trainer_mode": TRAINER_MODE})
    return VerlMapping(name, "worker-loss", {}, native, reason=why)


def objective_table(names: list[str] | None = None) -> list[VerlMapping]:
    """The mapping of every registered objective (registry defaults), in registration order."""
    return [mapping(n) for n in (names or list_objectives())]


def table_markdown(plans: list[VerlMapping] | None = None) -> str:
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


def _check_config(p: VerlMapping, loss_agg_mode: str, config) -> None:
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
    p = mapping(name, overrides)
    if p.mode != "registered":
        why = (f"it runs as pobench's worker loss ({p.reason}): verl's ppo_loss called it, so the actor's loss "
               f"function was not replaced; run with trainer.v1.trainer_mode={TRAINER_MODE} and "
               f"$VERL_USE_EXTERNAL_MODULES={TRAINER_MODULE} (make_verl_config sets both)"
               if p.mode == "worker-loss" else p.reason)

        def refuse(*args, **kwargs):
            raise ValueError(f"pobench objective {name!r} does not run as a verl policy loss ({p.mode}): {why}")
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
        batch = batch_for(objective, "verl policy loss", logprobs=log_prob,
                          old_logprobs=old_log_prob.to(log_prob.dtype), advantages=adv, mask=mask,
                          max_length=max_length)
        loss, metrics = objective.checked_loss(batch)
        loss = loss * _global_scale(aggregation, mask, config)
        return loss, {k: float(v) for k, v in metrics.items()}

    policy_loss.__name__ = policy_loss.__qualname__ = f"{PREFIX}{name}"
    policy_loss.__doc__ = f"pobench objective {name!r} as a verl policy loss (bench/engines/verl.py)."
    return policy_loss


def register_all() -> list[str]:
    """Register every pobench objective with verl as ``pobench_<name>`` (overrides from ``$POBENCH_VERL_OBJECTIVE_
    OVERRIDES``); objectives that run as pobench's worker loss (``mapping(name).mode == "worker-loss"``) or not at all
    get a stub that raises with the reason. Idempotent. Returns the names."""
    from verl.trainer.ppo.core_algos import register_policy_loss

    env = _env_overrides()
    names = []
    for name in list_objectives():
        register_policy_loss(PREFIX + name)(make_policy_loss(name, env.get(name)))
        names.append(PREFIX + name)
    return names


