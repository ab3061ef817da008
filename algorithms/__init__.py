"""The objective registry of pobench.

    from algorithms import PolicyBatch, get_objective, list_objectives
    obj = get_objective("tepo", kl_coef=0.1)
    loss, metrics = obj.loss(batch)

Every registration below is the single source of the names, descriptions and paper defaults that the CLI and
docs/objectives.md show.
"""

from __future__ import annotations

from .advantages import (
    TOKEN_ESTIMATORS,
    estimator_names,
    group_advantages,
    register_advantage,
    registered_advantage,
    sum_pi_squared,
    token_baseline_advantages,
    unregister_advantage,
)
from .aggregation import aggregate, aggregation_weight
from .base import Objective, ObjectiveConfig, param
from .batch import PolicyBatch, batch_for, has_advantage
from .critic import CriticSpec
from .gtpo import GTPO
from .is_reinforce import ISReinforce
from .kl import kl_estimate
from .pg_variants import CFPO, CISPO, DPPOKL, DPPOTV, DRO, GMPO, GPG, SAPO, TOPR, UP, VESPO
from .policy_gradient import GSPO, ClippedPG, PolicyGradient
from .ppo import PPO
from .registry import (
    default_config,
    get_objective,
    get_spec,
    list_controls,
    list_objectives,
    objective_groups,
    register,
    resolve_names,
    search_space,
    unregister,
)
from .selective import ClipCov, ForkingTokens, KLCov
from .tepo import TEPOObjective
from .tpo import TPO

__all__ = [
    "CriticSpec", "Objective", "ObjectiveConfig", "PolicyBatch", "batch_for", "has_advantage", "PPO",
    "PolicyGradient", "aggregate", "aggregation_weight",
    "default_config", "estimator_names", "get_objective", "get_spec", "group_advantages", "kl_estimate",
    "list_controls", "list_objectives", "objective_groups", "param", "register", "register_advantage",
    "registered_advantage", "resolve_names", "search_space", "sum_pi_squared", "TOKEN_ESTIMATORS",
    "token_baseline_advantages", "unregister", "unregister_advantage",
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

# --- the objectives TRL (GRPOConfig.loss_type and experimental trainers) and verl (policy-loss registry,
# advantage estimators) offer beyond the above; docs/objectives.md maps each to their names.
register("bnpo", ClippedPG, paper="TRL loss_type='bnpo'",
         description="BNPO (TRL's name): GRPO surrogate with token-mean over the batch, no KL (TRL's defaults).",
         aggregation="token-mean", kl_coef=0.0)
register("luspo", GSPO, paper="arXiv 2602.05261",
         description="LUSPO: GSPO's clipped sequence ratio, each sequence's loss summed over its tokens "
                     "(length-unbiased), mean over sequences.",
         aggregation="seq-mean-token-sum")
register("ppo_dual_clip", ClippedPG, paper="arXiv 1912.09729",
         description="Dual-clip PPO (verl 'vanilla' with clip_ratio_c = 3): loss of a token with Â < 0 at most −3·Â.",
         dual_clip_c=3.0, aggregation="token-mean", kl_coef=0.0)
register("cispo", CISPO, paper="arXiv 2506.13585",
         description="CISPO: −sg[clip(r, 0, 5)]·Â·lp, token-mean: the IS weight is clipped, every token keeps its "
                     "gradient.")
register("sapo", SAPO, paper="arXiv 2511.20347",
         description="SAPO: −(4/τ)σ(τ(r − 1))·Â, soft gate instead of the clip, τ_pos = 1, τ_neg = 1.05.")
register("gmpo", GMPO, paper="arXiv 2507.20673",
         description="GMPO (verl 'geo_mean'): geometric mean of token ratios clipped in log space to ±0.4, "
                     "per sequence.")
register("gpg", GPG, paper="arXiv 2504.02546",
         description="GPG: −Â·lp (no ratio, no clip), token-mean, GPG advantage α(R − mean_g R).")
register("vespo", VESPO, paper="arXiv 2602.10693",
         description="VESPO: −sg[φ(w_i)]·Â·lp with φ(w) = e^λ w^k e^{−λw} of the sequence ratio w_i, token-mean.")
register("rloo", ClippedPG, paper="arXiv 2402.14740",
         description="RLOO: leave-one-out baseline Â_i = R_i − mean_{j≠i} R_j on the GRPO surrogate, no KL.",
         advantage_estimator="rloo", kl_coef=0.0)
register("reinforce_pp", ClippedPG, paper="arXiv 2501.03262",
         description="REINFORCE++: batch-whitened reward as advantage (no group baseline), token-mean, no KL.",
         advantage_estimator="reinforce++", aggregation="token-mean", kl_coef=0.0)
register("reinforce_pp_baseline", ClippedPG, paper="arXiv 2501.03262",
         description="REINFORCE++-baseline: group-mean baseline, then batch whitening, token-mean, no KL.",
         advantage_estimator="reinforce++-baseline", aggregation="token-mean", kl_coef=0.0)
register("grpo_passk", ClippedPG, paper="arXiv 2503.19595",
         description="Pass@k training: only each group's best completion gets Â = (R_max − R_2nd)/std, GRPO surrogate.",
         advantage_estimator="grpo-passk")
register("opo", ClippedPG, paper="arXiv 2505.23585",
         description="OPO: on-policy, length-weighted optimal baseline R_i − Σ|y|R/Σ|y|, token-mean, no KL.",
         advantage_estimator="opo", aggregation="token-mean", kl_coef=0.0)
register("remax", ClippedPG, paper="arXiv 2310.10505",
         description="ReMax: the reward of one greedy completion per prompt as baseline, no KL.",
         advantage_estimator="remax", kl_coef=0.0)
register("maxrl", ClippedPG, paper="arXiv 2602.02710",
         description="MaxRL: advantage (R_i − mean_g R)/mean_g R (0 when no completion of the group succeeds), so a "
                     "prompt solved 1 time in N weighs N times one solved every time; GRPO's surrogate otherwise. "
                     "Binary rewards.",
         advantage_estimator="maxrl")
register("gdpo", ClippedPG, paper="arXiv 2601.05242",
         description="GDPO: each reward component (verifier outcome, answer format, DAPO's overlong penalty) z-scored "
                     "within its group on its own, weighted sum (all 1), whitened over the batch's tokens (verl "
                     "adv_estimator=gdpo); GRPO's surrogate and KL otherwise.",
         advantage_estimator="gdpo")
register("ppo", PPO, paper="arXiv 1707.06347",
         description="PPO with a critic (verl adv_estimator=gae): clipped token-ratio surrogate on per-token GAE "
                     "advantages (γ = λ = 1, whitened) from a learned value function initialised from the policy, "
                     "clipped value loss, token-mean, no KL.",
         aggregation="token-mean", kl_coef=0.0)
register("topr", TOPR, paper="arXiv 2503.14286",
         description="TOPR: −sg[w_i]·Â·lp, w_i = 1 for Â ≥ 0 and clip(π_θ(y_i)/π_old(y_i), 0, 1) for Â < 0 (sequence "
                     "ratio, detached), summed over tokens, mean over sequences; group-mean baseline, no KL.")

register("up_grpo", UP, paper="arXiv 2607.06987",
         description="UP-GRPO: a token with Â > 0 gets −Â·π_θ/sg(π_θ) (REINFORCE, no π_old anchor, no upper clip), a "
                     "token with Â ≤ 0 GRPO's clipped surrogate with dual clip c = 3; otherwise grpo's settings.")
register("dppo_tv", DPPOTV, paper="arXiv 2602.04879",
         description="DPPO-Binary-TV (verl 'dppo_tv'): −sg[M·min(r, 20)]·Â·lp, token-mean; M drops a token whose "
                     "probability moved more than δ = 0.2 from π_old in the direction Â pushes it (no ratio clip).")
register("dppo_kl", DPPOKL, paper="arXiv 2602.04879",
         description="DPPO-Binary-KL (verl 'dppo_kl'): as dppo_tv with the binary KL of π_old(y_t), π_θ(y_t) "
                     "against δ = 0.05 as the trust region.")
register("dro", DRO, paper="arXiv 2405.19107",
         description="DRO as verl's 'dro' loss: −(Â·lp − ½β(lp − old)²), β = 0.05, token-mean: REINFORCE with a "
                     "quadratic pull of every token back to π_old (Â = 0 tokens included).")
register("reinforce_is", ISReinforce, paper="verl 0.9.1 bypass_mode (loss_type=reinforce)",
         description="REINFORCE −sg[w]·Â·lp with w = π_θ/π_old per sequence (product of the token ratios; or per "
                     "token, or none) truncated at C = 2 (or masked outside [C_low, C]): verl's bypass_mode "
                     "reinforce loss when π_old is the sampler; group advantage, token-mean, no KL.")
register("cfpo", CFPO, paper="arXiv 2601.22801",
         description="CFPO: the clipped surrogate replaced by −(r·Â − |Â|·(r − 1)²/(2ε)), ε = 0.2 (a concave penalty "
                     "whose optimum is the clip edge r = 1 ± ε, no zero-gradient region); otherwise grpo's settings.")
register("gtpo", GTPO, paper="arXiv 2508.03772",
         description="GTPO as its authors' code: per-token Â_i·δ_it/n_i from R_i − mean_g R, conflict tokens shared "
                     "from the start / end by completions of both signs (δ = 2 on a positive one's, 0 on a negative "
                     "one's, n_i their count) and an entropy filter on π_old's mean entropy (Â − 0.1·H̄ if H̄ ≤ 0.7, "
                     "else 0), computed over whole groups at rollout time; −Â_it·π_θ/π_old, no clip, no KL.")
register("tpo", TPO, paper="arXiv 2604.06159",
         description="TPO (Target Policy Optimization) as the author's reference code: per group, p^θ = softmax of "
                     "the completions' summed log-probs, target q = softmax(ℓ^old + u/η) with u the population-std "
                     "standardised rewards (0 in an all-equal group), η = 1, detached; loss −Σ_i q_i log p_i^θ "
                     "averaged over groups; micro-batches of whole groups, no zero-advantage skip.")

# --- positive controls: GRPO with its credit assignment broken on purpose, so that a comparison can show that it
# could have detected a difference (`bench run --controls`; the report's controls section; docs/objectives.md)
register("ctrl-reversed", ClippedPG, paper="positive control (pobench)", control_of="grpo",
         description="Positive control: GRPO with every advantage negated (−Â_i), so each update descends the reward; "
                     "worse than grpo by construction.",
         advantage_estimator="group-reversed")
register("ctrl-shuffled", ClippedPG, paper="positive control (pobench)", control_of="grpo",
         description="Positive control: GRPO where completion i is credited with the advantage of another completion "
                     "of its group (i+1, cyclically): credit unrelated to its own answer but for a 1/(G−1) pull "
                     "against the reward; worse than grpo by construction.",
         advantage_estimator="group-rolled")
