"""The objective registry of pobench.

    from algorithms import PolicyBatch, get_objective, list_objectives
    obj = get_objective("tepo", kl_coef=0.1)
    loss, metrics = obj.loss(batch)

Every registration below is the single source of the names, descriptions and paper defaults that the CLI and
docs/objectives.md show.
"""

from __future__ import annotations

from .advantages import group_advantages
from .aggregation import aggregate, aggregation_weight
from .base import Objective, ObjectiveConfig, param
from .batch import PolicyBatch
from .kl import kl_estimate
from .policy_gradient import GSPO, ClippedPG
from .registry import (
    default_config,
    get_objective,
    get_spec,
    list_objectives,
    objective_groups,
    register,
    resolve_names,
    search_space,
    unregister,
)
from .selective import ClipCov, ForkingTokens, KLCov
from .tepo import TEPOObjective

__all__ = [
    "Objective", "ObjectiveConfig", "PolicyBatch", "aggregate", "aggregation_weight", "default_config",
    "get_objective", "get_spec", "group_advantages", "kl_estimate", "list_objectives", "objective_groups", "param",
    "register", "resolve_names", "search_space", "unregister",
]

register("grpo", ClippedPG, paper="arXiv 2402.03300",
         description="GRPO: clipped token-ratio surrogate, group z-score advantages, β·k3 KL to the reference.")
register("dr_grpo", ClippedPG, paper="arXiv 2503.20783",
         description="Dr. GRPO: no std normalisation, constant B·L_max normaliser, no KL.",
         aggregation="seq-mean-token-sum-norm", advantage_estimator="group-no-std", kl_coef=0.0)
register("dapo", ClippedPG, paper="arXiv 2503.14476",
         description="DAPO: clip-higher (0.2/0.28), token-mean, dynamic sampling, overlong shaping, no KL.",
         clip_high=0.28, aggregation="token-mean", kl_coef=0.0, dynamic_sampling=True, overlong_shaping=True)
register("gspo", GSPO, paper="arXiv 2507.18071",
         description="GSPO: clipped sequence (geometric-mean) ratio, ε = 3e-4 / 4e-4, no KL.")
register("entropy_reg", ClippedPG, paper="PPO-style entropy bonus",
         description="GRPO surrogate with an undifferentiated token-level entropy bonus α = 1e-3, no KL.",
         kl_coef=0.0, entropy_coef=1e-3)
register("clip_cov", ClipCov, paper="arXiv 2505.22617",
         description="Clip-Cov: detach the gradient of a random 2e-4 of the unclipped tokens with covariance in "
                     "(1, 5); PPO clip 1 / 1.",
         aggregation="token-mean", kl_coef=0.0)
register("kl_cov", KLCov, paper="arXiv 2505.22617",
         description="KL-Cov: unclipped surrogate, |lp − old| penalty on the top 2e-3 tokens by covariance.",
         aggregation="token-mean", kl_coef=0.0)
register("forking_tokens", ForkingTokens, paper="arXiv 2506.01939",
         description="80/20: policy gradient only on the top 20% tokens by sampling entropy.",
         clip_high=0.28, aggregation="token-mean", kl_coef=0.0)
register("tepo", TEPOObjective, paper="arXiv 2604.12736",
         description="TEPO: sequence-likelihood token credit, token-mean, KL mask on Â > τ_A and falling entropy.")
register("tepo-no-mask", base="tepo", description="TEPO ablation: β = 0 (sequence-likelihood link alone).",
         kl_coef=0.0)
register("tepo-mask-all", base="tepo", description="TEPO ablation: KL on every token (M ≡ 1).", kl_mask="all")
register("tepo-mask-adv", base="tepo", description="TEPO ablation: KL mask on Â > τ_A only.", kl_mask="adv")
register("tepo-mask-entropy", base="tepo", description="TEPO ablation: KL mask on falling entropy only.",
         kl_mask="entropy")
register("tepo-token-ratio", base="tepo", description="TEPO ablation: token ratio r_it (with DAPO's token clip "
         "0.2 / 0.28) instead of s_it.", ratio="token", clip_low=0.2, clip_high=0.28)
register("tepo-seq-mean", base="tepo", description="TEPO ablation: seq-mean-token-mean aggregation.",
         aggregation="seq-mean-token-mean")
register("tepo-likelihood-credit", base="tepo", description="TEPO ablation: likelihood-weighted token credit.",
         credit="likelihood")
register("tepo-kl-old", base="tepo", description="TEPO ablation: masked KL to π_old (a trust region) instead of π_ref.",
         kl_target="old")
register("tepo-entropy-old", base="tepo", description="TEPO ablation: entropy baseline H_old instead of H_ref.",
         entropy_baseline="old")
