"""Objectives that select tokens across the batch: Clip-Cov, KL-Cov (arXiv 2505.22617) and forking tokens
(the "80/20" high-entropy minority, arXiv 2506.01939).

Each is ``policy_gradient.ClippedPG`` with one ``select`` hook. Selections are made over the completion tokens of the
batch the objective is given (per micro-batch in training, as in verl) and never depend on padding: padded positions
are excluded before any ranking or sampling. The covariance selections count max(1, ⌊r·N⌋) tokens of the N completion
tokens (verl's count: at least one per micro-batch) and report that number as ``objective/cov_selected``.

As in the paper's code (PRIME-RL/Entropy-Mechanism-of-RL and verl ``core_algos``):
- KL-Cov: UNclipped surrogate −r·Â on every token, + k·|lp − old| on the top tokens by covariance;
- Clip-Cov: clipped surrogate (clip range 1 / 1 in the released scripts) set to 0 (so no gradient) on a random
  subset of the tokens with covariance strictly inside (cov_low, cov_high) that the PPO clip has NOT already removed
  (verl multiplies their loss by ``corr = 0``: the loss value drops their term too).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from .aggregation import masked_mean
from .base import param
from .batch import PolicyBatch
from .policy_gradient import ClippedPG, ClippedPGConfig, clipped_surrogate


def centred_covariance(batch: PolicyBatch) -> torch.Tensor:
    """Per-token (lp − mean lp)(Â − mean Â), means over completion tokens; detached. (B, T)"""
    lp = batch.logprobs.detach()
    adv = batch.advantages.detach()[:, None].expand_as(lp)
    return (lp - masked_mean(lp, batch.mask)) * (adv - masked_mean(adv, batch.mask))


def cov_count(frac: float, valid: torch.Tensor) -> int:
    """Tokens a covariance selection takes among the valid ones: max(1, ⌊frac·N⌋), 0 when frac = 0 or N = 0."""
    n_valid = int(valid.sum())
    return max(1, int(frac * n_valid)) if frac > 0 and n_valid else 0


def _top(scores: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask (B, T) of the k valid positions with the highest score."""
    flat = scores.masked_fill(~valid, float("-inf")).flatten()
    chosen = torch.zeros(flat.numel(), dtype=torch.bool)
    chosen[torch.topk(flat, k).indices] = True
    return chosen.view_as(valid) & valid


CLIP_COV_SCRIPT = "arXiv 2505.22617 (released script recipe/dapo/7b_clip_cov.sh)"


@dataclass(frozen=True)
class ClipCovConfig(ClippedPGConfig):
    clip_low: float = param(1.0, "ε_low of the PPO clip (1: no lower clip, ratio >= 0).", paper=CLIP_COV_SCRIPT,
                            search=(0.2, 1.0, False))
    clip_high: float = param(1.0, "ε_high of the PPO clip (1: ratio clipped at 2).", paper=CLIP_COV_SCRIPT,
                             search=(0.2, 1.0, False))
    clip_cov_frac: float = param(2e-4, "r: fraction of completion tokens whose gradient is detached (at least 1).",
                                 paper="arXiv 2505.22617", search=(1e-5, 1e-2, True))
    cov_low: float = param(1.0, "Lower bound of the covariance band of candidate tokens.", paper="arXiv 2505.22617")
    cov_high: float = param(5.0, "Upper bound of the covariance band of candidate tokens.", paper="arXiv 2505.22617")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_fraction("clip_cov_frac")
        if self.cov_high < self.cov_low:
            self._bad("cov_high", f"must be >= cov_low ({self.cov_low})")

    def _check_clip(self) -> None:  # the released scripts use ε = 1 (1 − ε_low = 0: no lower clip)
        for name in ("clip_low", "clip_high"):
            if not (0.0 < getattr(self, name) <= 1.0):
                self._bad(name, "must be in (0, 1]")


class ClipCov(ClippedPG):
    """Clip-Cov: detach the gradient of a random fraction r of the tokens that the PPO clip kept and whose covariance
    lies strictly inside (cov_low, cov_high); their term is 0 in the loss value too (verl's ``corr = 0``)."""

    config_class = ClipCovConfig
    split_invariant = False

    def token_advantage_refusal(self) -> str | None:
        return ("its selection ranks tokens by the covariance of log π with the per-completion Â_i "
                "(centred_covariance) and reads the clip masks of Â_i")

    def select(self, pg, batch, generator):
        c = self.config
        valid = batch.mask > 0
        _, low, high = clipped_surrogate(self.ratio(batch), batch.advantages[:, None], c.clip_low, c.clip_high)
        cov = centred_covariance(batch)
        band = valid & ~(low | high) & (cov > c.cov_low) & (cov < c.cov_high)
        candidates = torch.nonzero(band.flatten()).flatten()
        k = min(cov_count(c.clip_cov_frac, valid), candidates.numel())
        chosen = candidates[torch.randperm(candidates.numel(), generator=generator)[:k]]
        detach = torch.zeros(valid.numel(), dtype=torch.bool)
        detach[chosen] = True
        detach = detach.view_as(valid)
        # the selected tokens' term is 0 (value and gradient), as verl's ``corr = 0``: not its detached value
        pg = torch.where(detach, torch.zeros_like(pg), pg)
        return pg, torch.zeros_like(pg), {"objective/detached_frac": masked_mean(detach.to(pg.dtype), batch.mask),
                                          "objective/cov_selected": detach.sum().to(pg.dtype)}


UNUSED_CLIP = "used only with surrogate=clipped (KL-Cov's surrogate is unclipped)."


@dataclass(frozen=True)
class KLCovConfig(ClippedPGConfig):
    clip_low: float = param(0.2, f"ε_low of the PPO clip: {UNUSED_CLIP}")
    clip_high: float = param(0.2, f"ε_high of the PPO clip: {UNUSED_CLIP}")
    surrogate: str = param("unclipped", "unclipped: −r·Â on every token (the paper, verl); clipped: the PPO clip.",
                           paper="arXiv 2505.22617", choices=("unclipped", "clipped"))
    kl_cov_frac: float = param(2e-3, "Fraction of completion tokens (top by covariance) given the |lp − old| penalty.",
                               paper="arXiv 2505.22617", search=(1e-4, 2e-2, True))
    kl_cov_coef: float = param(1.0, "k: weight of |lp − old| on the selected tokens.", paper="arXiv 2505.22617")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_fraction("kl_cov_frac")
        self._check_nonneg("kl_cov_coef")
        if self.surrogate == "unclipped":
            for f in dataclasses.fields(self):
                if f.name in ("clip_low", "clip_high") and getattr(self, f.name) != f.default:
                    self._bad(f.name, "has no effect with surrogate='unclipped' (valid surrogates: unclipped, "
                                      "clipped)")


class KLCov(ClippedPG):
    """KL-Cov: unclipped surrogate −r·Â, + k·|lp − old| on the top fraction of tokens ranked by centred covariance."""

    config_class = KLCovConfig
    split_invariant = False
    weights_select_penalty = True  # k·|lp − old| is part of verl's per-token policy loss, which its IS weights scale

    @property
    def has_clip(self) -> bool:
        return self.config.surrogate == "clipped"  # (unclipped, the paper's: no clip, its fractions are 0)

    def token_advantage_refusal(self) -> str | None:
        return ("its selection ranks tokens by the covariance of log π with the per-completion Â_i "
                "(centred_covariance), and its unclipped surrogate is −r·Â_i")

    def select(self, pg, batch, generator):
        c = self.config
        metrics = {}
        if c.surrogate == "unclipped":
            pg = -self.ratio(batch) * batch.advantages[:, None]  # (B, T): no clip, so nothing is clipped
            zero = torch.zeros((), dtype=pg.dtype)
            metrics = {"objective/clip_frac_low": zero, "objective/clip_frac_high": zero}
        valid = batch.mask > 0
        selected = _top(centred_covariance(batch), valid, cov_count(c.kl_cov_frac, valid))
        penalty = c.kl_cov_coef * (batch.logprobs - batch.old_logprobs).abs() * selected
        return pg, penalty, {**metrics, "objective/selected_frac": masked_mean(selected.to(pg.dtype), batch.mask),
                             "objective/cov_selected": selected.sum().to(pg.dtype)}


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

    @property
    def batch_fields(self) -> frozenset[str]:
        return super().batch_fields | {"old_entropy"}

    def select(self, pg, batch, generator):
        valid = batch.mask > 0
        k = math.ceil(self.config.forking_frac * int(valid.sum()))
        selected = _top(batch.require("old_entropy", self.name).detach(), valid, k)
        return pg * selected, torch.zeros_like(pg), {
            "objective/selected_frac": masked_mean(selected.to(pg.dtype), batch.mask)}
