"""Policy-gradient objectives sharing one loss skeleton (``PolicyGradient``), and the clipped family: GRPO, Dr. GRPO,
DAPO, BNPO, LUSPO, dual-clip PPO, the entropy-regularised variant, and GSPO.

Per-token term (ratio r = exp(lp − old) per token, or ρ_i = exp(Σ_t m (lp − old) / |y_i|) per sequence; Â_i
broadcast over tokens; w the rollout-correction weight × off-policy mask of ``correction.prepare``):

    ℓ_it = w_it · policy_term_it + β·KL_it (· r_it with ``kl_is_correction``) − α·H_θ(i,t)

reduced by the objective's aggregation. The clipped surrogate's policy term is
−min(min(r, δ) Â_i, clip(r, 1 − ε_low, 1 + ε_high) Â_i), and with dual clip (Â_i < 0) at most −c·Â_i.
Other policy terms (CISPO, SAPO, GMPO, GPG, VESPO) live in ``pg_variants.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .aggregation import aggregate, masked_mean
from .base import SELECTS_ACROSS_BATCH, Objective, ObjectiveConfig, param
from .batch import PolicyBatch
from .correction import prepare
from .kl import KL_ESTIMATORS, kl_estimate


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """−min(ratio·Â, clip(ratio)·Â) per token, and the masks of tokens whose gradient the clip removed.

    ``ratio`` (B, T) or (B, 1); ``adv`` (B, 1) or (B, T). Returns (term, clipped_low, clipped_high), each (B, T).
    """
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    term = -torch.min(unclipped, clipped)
    low = (ratio < 1.0 - clip_low) & (adv < 0)
    high = (ratio > 1.0 + clip_high) & (adv > 0)
    shape = torch.broadcast_shapes(ratio.shape, adv.shape)
    return term.expand(shape), low.expand(shape), high.expand(shape)


def surrogate_metrics(ratio: torch.Tensor, low: torch.Tensor, high: torch.Tensor, mask: torch.Tensor
                      ) -> dict[str, torch.Tensor]:
    """Clip fractions and ratio statistics over completion tokens (detached)."""
    ratio = ratio.detach().expand(mask.shape)
    valid = mask > 0
    return {
        "objective/clip_frac_low": masked_mean(low.to(mask.dtype), mask),
        "objective/clip_frac_high": masked_mean(high.to(mask.dtype), mask),
        "objective/ratio_mean": masked_mean(ratio, mask),
        "objective/ratio_max": ratio[valid].max() if valid.any() else torch.ones(()),
    }


def entropy_metric(batch: PolicyBatch) -> torch.Tensor:
    """Mean entropy of the current policy over completion tokens (falls back to H_old)."""
    h = batch.entropy if batch.entropy is not None else batch.old_entropy
    if h is None:
        return torch.full((), float("nan"))
    return masked_mean(h.detach(), batch.mask)


RATIO_LEVELS = ("token", "sequence")
#: where the adaptive entropy coefficient comes from (docs/objectives.md: our reading of TRL's controller)
ADAPTIVE_ENTROPY = "TRL 1.16 use_adaptive_entropy (Skywork-OR1, arXiv 2505.22312)"


@dataclass(frozen=True)
class PGConfig(ObjectiveConfig):
    """Fields of every ``PolicyGradient`` objective: ratio level, KL to the reference, entropy bonus."""

    ratio_level: str = param("token", "Importance ratio per token r_it, or per sequence ρ_i = exp(mean_t (lp − old)) "
                             "(TRL importance_sampling_level).", paper="arXiv 2507.18071", choices=RATIO_LEVELS)
    kl_coef: float = param(0.04, "β: weight of the per-token KL to the reference policy (0 disables it).",
                           paper="arXiv 2402.03300", search=(1e-3, 1e-1, True), switch=True)
    kl_estimator: str = param("k3", "Per-token KL estimator: k1, k2 or k3.", paper="arXiv 2402.03300",
                              choices=KL_ESTIMATORS)
    kl_is_correction: bool = param(False, "Multiply the KL by the importance ratio (unbiased off-policy KL, r·k3; "
                                   "TRL use_bias_correction_kl).", paper="arXiv 2512.02556")
    entropy_coef: float = param(0.0, "α: entropy bonus weight, loss −= α·H_θ per token (0 disables it); with "
                                "entropy_target > 0 the controller's initial α.", search=(1e-4, 1e-2, True),
                                switch=True)
    entropy_target: float = param(0.0, "H*: TRL's adaptive entropy coefficient: after each optimizer step α += δ if "
                                  "its mean H_θ <= H*, else −= δ, and α acts only while the last one was <= H* (TRL "
                                  "entropy_target 0.2; 0 disables the controller).", paper=ADAPTIVE_ENTROPY,
                                  search=(0.05, 2.0, True), switch=True)
    entropy_coef_delta: float = param(0.005, "δ: step of the adaptive entropy coefficient per optimizer step (TRL "
                                      "entropy_coef_delta).", paper=ADAPTIVE_ENTROPY, requires="entropy_target")
    entropy_coef_min: float = param(0.0, "Lower bound of the adaptive entropy coefficient (TRL entropy_coef_min).",
                                    paper=ADAPTIVE_ENTROPY, requires="entropy_target")
    entropy_coef_max: float = param(1.0, "Upper bound of the adaptive entropy coefficient (TRL entropy_coef_max).",
                                    paper=ADAPTIVE_ENTROPY, requires="entropy_target")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_nonneg("kl_coef", "entropy_coef", "entropy_target", "entropy_coef_delta", "entropy_coef_min")
        if self.entropy_coef_max < self.entropy_coef_min:
            self._bad("entropy_coef_max", f"must be >= entropy_coef_min={self.entropy_coef_min!r}")


class PolicyGradient(Objective):
    """The shared loss skeleton; subclasses implement ``policy_term`` (and optionally ``select``)."""

    config_class = PGConfig
    supports_batch_options = True
    #: True when ``policy_term`` applies the rollout-correction weights itself (then the skeleton does not)
    folds_is_weights = False
    #: True when the penalty ``select`` returns is part of the policy term (KL-Cov's k·|lp − old|, inside verl's
    #: per-token policy loss): the off-policy mask and the rollout-correction weights then act on it as on the policy
    #: term. False: they act on the policy term only (the penalty is a regulariser, like β·KL)
    weights_select_penalty = False
    #: True when ``policy_term`` is 0 with zero gradient for a sequence with Â_i = 0 (Â_i times a finite factor), so
    #: only the KL and entropy terms can give such a sequence gradient (``zero_advantage_terms``)
    policy_term_vanishes_at_zero_advantage = False

    def token_advantage_refusal(self) -> str | None:
        """None: the skeleton hands ``policy_term`` Â as (B, T) ``token_advantages`` when a per-token estimator is
        selected, and a policy term that treats Â token by token (the clipped surrogate, CISPO, SAPO, ...) is then the
        per-token loss. A subclass whose policy term or selection reads Â_i per completion refuses (one line why)."""
        return None

    def zero_advantage_terms(self) -> tuple[str, ...]:
        c = self.config
        terms = [] if self.split_invariant else [SELECTS_ACROSS_BATCH]
        if not self.policy_term_vanishes_at_zero_advantage:
            terms.append("the policy term (not declared to vanish at Â = 0)")
        if c.kl_coef > 0:
            terms.append(f"β·KL to the reference on every token (kl_coef = {c.kl_coef:g})")
        if c.entropy_target > 0:  # (whatever the state: α may act from the next optimizer step on)
            terms.append(f"the adaptive entropy bonus on every token (entropy_target = {c.entropy_target:g})")
        elif c.entropy_coef > 0:
            terms.append(f"the entropy bonus on every token (entropy_coef = {c.entropy_coef:g})")
        return tuple(terms)

    @property
    def needs_entropy_grad(self) -> bool:
        return self.config.entropy_coef > 0 or self.config.entropy_target > 0

    @property
    def batch_fields(self) -> frozenset[str]:
        c = self.config
        return super().batch_fields | {f for f, on in (("ref_logprobs", c.kl_coef > 0),
                                                       ("entropy", c.entropy_coef > 0 or c.entropy_target > 0)) if on}

    @property
    def separable_kl(self) -> float | None:
        c = self.config  # (r·KL has a factor; mask_truncated drops the truncated completions' KL too)
        return None if c.kl_coef > 0 and (c.kl_is_correction or c.mask_truncated) else c.kl_coef

    # --- TRL's adaptive entropy coefficient: state {entropy_coef: α, entropy: the last optimizer step's mean H_θ}
    def initial_state(self) -> dict[str, float]:
        c = self.config
        if c.entropy_target == 0:
            return {}
        return {"entropy_coef": c.entropy_coef, "entropy": math.inf}  # inf: no bonus before a first measurement

    def probe_state(self) -> dict[str, float] | None:
        """With the controller: α after one optimizer step whose H_θ was at most H* (the gate open), so the probe
        sees the bonus the run applies from its second optimizer step on (at the initial state it applies none)."""
        c = self.config
        if c.entropy_target == 0:
            return None
        return {"entropy_coef": min(c.entropy_coef + c.entropy_coef_delta, c.entropy_coef_max), "entropy": 0.0}

    def entropy_alpha(self) -> float:
        """α applied to −α·H_θ now: ``entropy_coef``, or with the controller its α while the entropy measured at the
        last optimizer step is <= H* (0 otherwise, and before the first: TRL's gate)."""
        c, s = self.config, self.state
        if c.entropy_target == 0:
            return c.entropy_coef
        return s["entropy_coef"] if s["entropy"] <= c.entropy_target else 0.0

    def state_sums(self, batch: PolicyBatch) -> dict[str, torch.Tensor]:
        """Σ m·H_θ and Σ m over the tokens of the loss (``mask_truncated`` applied), the current policy's entropy."""
        if self.config.entropy_target == 0:
            return {}
        mask = prepare(batch, self.config)[0].mask
        h = batch.require("entropy", self.name).detach()
        return {"entropy_sum": (h * mask).sum(), "tokens": mask.sum()}

    def next_state(self, state: dict[str, float], sums: dict[str, float]) -> dict[str, float]:
        """TRL's rule: H = Σ m·H_θ / max(Σ m, 1) over the optimizer step; α ← min(α + δ, α_max) if H <= H*, else
        max(α − δ, α_min)."""
        c = self.config
        if c.entropy_target == 0:
            return state
        h = sums["entropy_sum"] / max(sums["tokens"], 1.0)
        if h <= c.entropy_target:
            coef = min(state["entropy_coef"] + c.entropy_coef_delta, c.entropy_coef_max)
        else:
            coef = max(state["entropy_coef"] - c.entropy_coef_delta, c.entropy_coef_min)
        return {"entropy_coef": coef, "entropy": h}

    def state_metrics(self) -> dict[str, float]:
        return {"objective/entropy_coef": self.state["entropy_coef"]} if self.state else {}

    def ratio(self, batch: PolicyBatch) -> torch.Tensor:
        """Importance ratio: (B, T) at token level, (B, 1) at sequence level (gradient flows through both)."""
        log_ratio = batch.logprobs - batch.old_logprobs
        if self.config.ratio_level == "token":
            return torch.exp(log_ratio)
        seq = (log_ratio * batch.mask).sum(-1) / batch.mask.sum(-1).clamp(min=1.0)  # (B,)
        return torch.exp(seq)[:, None]

    def policy_term(self, batch: PolicyBatch, ratio: torch.Tensor, adv: torch.Tensor, is_w: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """(policy term (B, T), clipped-low mask, clipped-high mask, extra metrics)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement policy_term(batch, ratio, adv, is_w), "
                                  "which a PolicyGradient subclass must")

    def _checked_term(self, out: Any, batch: PolicyBatch) -> tuple:
        """``policy_term``'s result, checked (a plugin's included): the term and both clip masks are tensors of the
        batch's (B, T) or (B, 1) shape; a wrong one fails here in one line naming the objective, not as a broadcast
        deep in the loss."""
        B, T = batch.logprobs.shape
        what = ("the policy term", "the clipped-low mask", "the clipped-high mask")
        if not isinstance(out, tuple) or len(out) != 4:
            raise ValueError(f"objective {self.name!r}: policy_term returned {type(out).__name__}, expected (term, "
                             "clipped-low mask, clipped-high mask, metrics)")
        for name, t in zip(what, out[:3]):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[0] != B or t.shape[1] not in (1, T):
                raise ValueError(f"objective {self.name!r}: policy_term returned {name} of shape {got}, expected "
                                 f"({B}, {T}) (completions, tokens) or ({B}, 1)")
        return out

    def select(self, pg: torch.Tensor, batch: PolicyBatch, generator: torch.Generator | None
               ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Hook for token-selective variants: (policy-gradient term, extra penalty term, metrics). Identity here."""
        return pg, torch.zeros_like(pg), {}

    def loss(self, batch: PolicyBatch, generator: torch.Generator | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        batch, is_w, keep, batch_metrics = prepare(batch, c)
        ratio = self.ratio(batch)
        # (B, 1) Â_i broadcast over the tokens, or (B, T) Â_it for an objective with per-token advantages (PPO, or a
        # per-token estimator: ``token_estimator``)
        adv = batch.require("token_advantages", self.name) if self.uses_token_advantages else batch.advantages[:, None]
        pg, low, high, term_metrics = self._checked_term(self.policy_term(batch, ratio, adv, is_w), batch)
        pg = pg.expand_as(batch.logprobs)
        pg, penalty, extra_metrics = self.select(pg, batch, generator)
        if keep is not None:
            pg = pg * keep
            if self.weights_select_penalty:
                penalty = penalty * keep
        if is_w is not None:
            if not self.folds_is_weights:
                pg = pg * is_w
            if self.weights_select_penalty:
                penalty = penalty * is_w
        if c.kl_coef > 0:
            kl = kl_estimate(batch.logprobs, batch.require("ref_logprobs", self.name), c.kl_estimator)
            if c.kl_is_correction:
                kl = kl * ratio
            penalty = penalty + c.kl_coef * kl
        per_token = pg + penalty
        alpha = self.entropy_alpha()
        if alpha > 0:
            per_token = per_token - alpha * batch.require("entropy", self.name)
        loss = aggregate(per_token, batch.mask, c.aggregation, batch.max_length)
        metrics = {
            "objective/policy_loss": aggregate(pg, batch.mask, c.aggregation, batch.max_length).detach(),
            "objective/kl_term": aggregate(penalty, batch.mask, c.aggregation, batch.max_length).detach(),
            "objective/entropy": entropy_metric(batch),
            **surrogate_metrics(ratio, low, high, batch.mask),
            **term_metrics,
            **extra_metrics,
            **batch_metrics,
        }
        if c.entropy_target > 0:
            metrics["objective/entropy_coef_applied"] = torch.tensor(alpha, dtype=loss.dtype)
        return loss, metrics


@dataclass(frozen=True)
class ClippedPGConfig(PGConfig):
    """Ratio clipped to [1 − ε_low, 1 + ε_high] (GRPO family), with optional two-sided and dual clip."""

    clip_low: float = param(0.2, "ε_low: lower clip range of the ratio.", paper="arXiv 2402.03300",
                            search=(0.05, 0.4, False))
    clip_high: float = param(0.2, "ε_high: upper clip range of the ratio (DAPO's clip-higher: 0.28).",
                             paper="arXiv 2402.03300", search=(0.05, 0.4, False))
    clip_delta: float = param(0.0, "δ: two-sided clip, the unclipped ratio is capped at δ (INTELLECT-2 uses 4; "
                              "0 disables it; TRL delta).", paper="arXiv 2505.07291", search=(1.5, 10.0, True),
                              switch=True)
    dual_clip_c: float = param(0.0, "c: dual clip, the loss of a token with Â < 0 is at most −c·Â (paper: 3; 0 "
                               "disables it; verl clip_ratio_c).", paper="arXiv 1912.09729",
                               search=(1.5, 10.0, True), switch=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_clip()
        if self.clip_delta != 0 and self.clip_delta <= 1.0 + self.clip_high:
            self._bad("clip_delta", "must be 0 (off) or > 1 + clip_high")
        if self.dual_clip_c != 0 and self.dual_clip_c <= 1.0:
            self._bad("dual_clip_c", "must be 0 (off) or > 1")

    def _check_clip(self) -> None:  # Clip-Cov overrides it (its released scripts use ε = 1)
        self._check_epsilon("clip_low", "clip_high")


class ClippedPG(PolicyGradient):
    """GRPO-family objective (grpo, dr_grpo, dapo, bnpo, luspo, ppo_dual_clip, entropy_reg differ only in config)."""

    config_class = ClippedPGConfig
    policy_term_vanishes_at_zero_advantage = True  # −min(r·Â, clip(r)·Â), capped at −c·Â: 0 at Â = 0

    def policy_term(self, batch, ratio, adv, is_w):
        c = self.config
        unclipped = ratio.clamp(max=c.clip_delta) if c.clip_delta > 0 else ratio
        term = -torch.min(unclipped * adv, torch.clamp(ratio, 1.0 - c.clip_low, 1.0 + c.clip_high) * adv)
        low = (ratio < 1.0 - c.clip_low) & (adv < 0)
        high = (ratio > 1.0 + c.clip_high) & (adv > 0)
        shape = batch.logprobs.shape
        metrics = {}
        if c.dual_clip_c > 0:
            cap = -c.dual_clip_c * adv  # (B, 1)
            dual = (adv < 0) & (term > cap)
            term = torch.where(adv < 0, torch.minimum(term, cap), term)
            metrics["objective/dual_clip_frac"] = masked_mean(dual.expand(shape).to(batch.mask.dtype), batch.mask)
        return term.expand(shape), low.expand(shape), high.expand(shape), metrics


@dataclass(frozen=True)
class GSPOConfig(ClippedPGConfig):
    """GSPO: the sequence ratio is clipped, with a much tighter range."""

    ratio_level: str = param("sequence", "Importance ratio per token r_it, or per sequence ρ_i = exp(mean_t (lp − "
                             "old)) (GSPO: sequence).", paper="arXiv 2507.18071", choices=RATIO_LEVELS)
    clip_low: float = param(3e-4, "ε_low on the sequence ratio ρ_i.", paper="arXiv 2507.18071",
                            search=(1e-4, 2e-3, True))
    clip_high: float = param(4e-4, "ε_high on the sequence ratio ρ_i.", paper="arXiv 2507.18071",
                             search=(1e-4, 2e-3, True))
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (GSPO uses none).",
                           paper="arXiv 2507.18071", search=(1e-3, 1e-1, True), switch=True)


class GSPO(ClippedPG):
    """Group Sequence Policy Optimization: ρ_i = exp(mean_t (lp − old)) clipped per sequence."""

    config_class = GSPOConfig
