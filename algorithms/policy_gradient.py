"""Clipped policy-gradient objectives: GRPO, Dr. GRPO, DAPO, the entropy-regularised variant, and GSPO.

Per-token term (token ratio r_it = exp(lp − old), Â_i broadcast over tokens):

    ℓ_it = −min(r_it Â_i, clip(r_it, 1 − ε_low, 1 + ε_high) Â_i) + β·KL_it − α·H_θ(i,t)

reduced by the objective's aggregation. GSPO (arXiv 2507.18071) replaces r_it by the sequence ratio
ρ_i = exp(Σ_t m (lp − old) / |y_i|).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .aggregation import aggregate, masked_mean
from .base import Objective, ObjectiveConfig, param
from .batch import PolicyBatch
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


@dataclass(frozen=True)
class ClippedPGConfig(ObjectiveConfig):
    """Token-ratio clipped surrogate with optional KL to the reference and entropy bonus (GRPO family)."""

    clip_low: float = param(0.2, "ε_low: lower clip range of the ratio.", paper="arXiv 2402.03300",
                            search=(0.05, 0.4, False))
    clip_high: float = param(0.2, "ε_high: upper clip range of the ratio (DAPO's clip-higher: 0.28).",
                             paper="arXiv 2402.03300", search=(0.05, 0.4, False))
    kl_coef: float = param(0.04, "β: weight of the per-token KL to the reference policy (0 disables it).",
                           paper="arXiv 2402.03300", search=(1e-3, 1e-1, True), switch=True)
    kl_estimator: str = param("k3", "Per-token KL estimator: k1, k2 or k3.", paper="arXiv 2402.03300",
                              choices=KL_ESTIMATORS)
    entropy_coef: float = param(0.0, "α: entropy bonus weight, loss −= α·H_θ per token (0 disables it).",
                                search=(1e-4, 1e-2, True), switch=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_clip()
        self._check_nonneg("kl_coef", "entropy_coef")

    def _check_clip(self) -> None:
        self._check_epsilon("clip_low", "clip_high")


class ClippedPG(Objective):
    """GRPO-family objective (grpo, dr_grpo, dapo, entropy_reg differ only in config defaults)."""

    config_class = ClippedPGConfig

    @property
    def needs_reference(self) -> bool:
        return self.config.kl_coef > 0

    @property
    def needs_entropy_grad(self) -> bool:
        return self.config.entropy_coef > 0

    def ratio(self, batch: PolicyBatch) -> torch.Tensor:
        """Importance ratio: token level, (B, T)."""
        return torch.exp(batch.logprobs - batch.old_logprobs)

    def select(self, pg: torch.Tensor, batch: PolicyBatch, generator: torch.Generator | None
               ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Hook for token-selective variants: (policy-gradient term, extra penalty term, metrics). Identity here."""
        return pg, torch.zeros_like(pg), {}

    def loss(self, batch: PolicyBatch, generator: torch.Generator | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        ratio = self.ratio(batch)
        adv = batch.advantages[:, None]  # (B, 1)
        pg, low, high = clipped_surrogate(ratio, adv, c.clip_low, c.clip_high)  # (B, T)
        pg, penalty, extra_metrics = self.select(pg, batch, generator)
        if c.kl_coef > 0:
            penalty = penalty + c.kl_coef * kl_estimate(batch.logprobs, batch.require("ref_logprobs", self.name),
                                                        c.kl_estimator)
        per_token = pg + penalty
        if c.entropy_coef > 0:
            per_token = per_token - c.entropy_coef * batch.require("entropy", self.name)
        loss = aggregate(per_token, batch.mask, c.aggregation, batch.max_length)
        metrics = {
            "objective/policy_loss": aggregate(pg, batch.mask, c.aggregation, batch.max_length).detach(),
            "objective/kl_term": aggregate(penalty, batch.mask, c.aggregation, batch.max_length).detach(),
            "objective/entropy": entropy_metric(batch),
            **surrogate_metrics(ratio, low, high, batch.mask),
            **extra_metrics,
        }
        return loss, metrics


@dataclass(frozen=True)
class GSPOConfig(ClippedPGConfig):
    """GSPO: the sequence ratio is clipped, with a much tighter range."""

    clip_low: float = param(3e-4, "ε_low on the sequence ratio ρ_i.", paper="arXiv 2507.18071",
                            search=(1e-4, 2e-3, True))
    clip_high: float = param(4e-4, "ε_high on the sequence ratio ρ_i.", paper="arXiv 2507.18071",
                             search=(1e-4, 2e-3, True))
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (GSPO uses none).",
                           paper="arXiv 2507.18071", search=(1e-3, 1e-1, True), switch=True)


class GSPO(ClippedPG):
    """Group Sequence Policy Optimization: ρ_i = exp(mean_t (lp − old)) clipped per sequence."""

    config_class = GSPOConfig

    def ratio(self, batch: PolicyBatch) -> torch.Tensor:
        log_ratio = (batch.logprobs - batch.old_logprobs) * batch.mask  # (B, T)
        seq = log_ratio.sum(-1) / batch.mask.sum(-1).clamp(min=1.0)  # (B,)
        return torch.exp(seq)[:, None]  # (B, 1)
