"""Objectives that select tokens across the batch: Clip-Cov, KL-Cov (arXiv 2505.22617) and forking tokens
(the "80/20" high-entropy minority, arXiv 2506.01939).

Each is the clipped surrogate of ``policy_gradient.ClippedPG`` with one ``select`` hook. Selections are made over the
completion tokens of the batch the objective is given (per micro-batch in training, as in verl) and never depend on
padding: padded positions are excluded before any ranking or sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .aggregation import masked_mean
from .base import param
from .batch import PolicyBatch
from .policy_gradient import ClippedPG, ClippedPGConfig


def centred_covariance(batch: PolicyBatch) -> torch.Tensor:
    """Per-token (lp − mean lp)(Â − mean Â), means over completion tokens; detached. (B, T)"""
    lp = batch.logprobs.detach()
    adv = batch.advantages.detach()[:, None].expand_as(lp)
    return (lp - masked_mean(lp, batch.mask)) * (adv - masked_mean(adv, batch.mask))


def _top(scores: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask (B, T) of the k valid positions with the highest score."""
    flat = scores.masked_fill(~valid, float("-inf")).flatten()
    chosen = torch.zeros(flat.numel(), dtype=torch.bool)
    chosen[torch.topk(flat, k).indices] = True
    return chosen.view_as(valid) & valid


@dataclass(frozen=True)
class ClipCovConfig(ClippedPGConfig):
    clip_cov_frac: float = param(2e-4, "r: fraction of completion tokens whose gradient is detached.",
                                 paper="arXiv 2505.22617", search=(1e-5, 1e-2, True))
    cov_low: float = param(1.0, "Lower bound of the covariance band of candidate tokens.", paper="arXiv 2505.22617")
    cov_high: float = param(5.0, "Upper bound of the covariance band of candidate tokens.", paper="arXiv 2505.22617")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_fraction("clip_cov_frac")
        if self.cov_high < self.cov_low:
            self._bad("cov_high", f"must be >= cov_low ({self.cov_low})")


class ClipCov(ClippedPG):
    """Clip-Cov: detach the gradient of a random fraction r of tokens whose covariance lies in [cov_low, cov_high]."""

    config_class = ClipCovConfig
    split_invariant = False

    def select(self, pg, batch, generator):
        c = self.config
        valid = batch.mask > 0
        cov = centred_covariance(batch)
        candidates = torch.nonzero((valid & (cov >= c.cov_low) & (cov <= c.cov_high)).flatten()).flatten()
        n_valid = int(valid.sum())
        k = max(1, int(c.clip_cov_frac * n_valid)) if c.clip_cov_frac > 0 and n_valid else 0
        k = min(k, candidates.numel())
        chosen = candidates[torch.randperm(candidates.numel(), generator=generator)[:k]]
        detach = torch.zeros(valid.numel(), dtype=torch.bool)
        detach[chosen] = True
        detach = detach.view_as(valid)
        pg = torch.where(detach, pg.detach(), pg)
        return pg, torch.zeros_like(pg), {"objective/detached_frac": masked_mean(detach.to(pg.dtype), batch.mask)}


@dataclass(frozen=True)
class KLCovConfig(ClippedPGConfig):
    kl_cov_frac: float = param(2e-3, "Fraction of completion tokens (top by covariance) given the |lp − old| penalty.",
                               paper="arXiv 2505.22617", search=(1e-4, 2e-2, True))
    kl_cov_coef: float = param(1.0, "k: weight of |lp − old| on the selected tokens.", paper="arXiv 2505.22617")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_fraction("kl_cov_frac")
        self._check_nonneg("kl_cov_coef")


class KLCov(ClippedPG):
    """KL-Cov: add k·|lp − old| on the top fraction of tokens ranked by centred covariance."""

    config_class = KLCovConfig
    split_invariant = False

    def select(self, pg, batch, generator):
        c = self.config
        valid = batch.mask > 0
        n_valid = int(valid.sum())
        k = max(1, int(c.kl_cov_frac * n_valid)) if c.kl_cov_frac > 0 and n_valid else 0
        selected = _top(centred_covariance(batch), valid, k)
        penalty = c.kl_cov_coef * (batch.logprobs - batch.old_logprobs).abs() * selected
        return pg, penalty, {"objective/selected_frac": masked_mean(selected.to(pg.dtype), batch.mask)}


@dataclass(frozen=True)
class ForkingConfig(ClippedPGConfig):
    forking_frac: float = param(0.2, "ρ: fraction of completion tokens (highest H_old) that get a policy gradient.",
                                paper="arXiv 2506.01939", search=(0.05, 0.5, False))

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_fraction("forking_frac")


class ForkingTokens(ClippedPG):
    """Policy gradient only on the top-ρ tokens by entropy of the sampling policy; the others contribute zero
    (the normaliser still counts every completion token, as in the paper's token-level objective)."""

    config_class = ForkingConfig
    split_invariant = False

    def select(self, pg, batch, generator):
        valid = batch.mask > 0
        k = math.ceil(self.config.forking_frac * int(valid.sum()))
        selected = _top(batch.require("old_entropy", self.name).detach(), valid, k)
        return pg * selected, torch.zeros_like(pg), {
            "objective/selected_frac": masked_mean(selected.to(pg.dtype), batch.mask)}
