"""TEPO (arXiv 2604.12736, v1 2510.09369) as this suite reads it; see docs/objectives.md for the reading.

1. Sequence-likelihood link: s_it = sg[ρ_i] · exp(lp_it − sg[lp_it]) (value ρ_i, gradient of its own token),
   ℓ_it = −min(s_it Â_i, clip(s_it, 1 − ε_low, 1 + ε_high) Â_i).
2. Token-level aggregation (token-mean over every completion token of the batch).
3. KL mask: M_it = 1[Â_i > τ_A] · 1[H_θ(i,t) < H_base(i,t) − τ_H], term β · M_it · KL_it added to ℓ_it, with
   KL_it to π_ref (default) or to π_old (a trust region), and H_base = H_ref (default) or H_old.
4. Optional likelihood credit: Â_i scaled per token by w_it = |y_i| · (−old_it) / Σ_t (−old_it).

Every choice is a config field so each alternative reading is one ablation away.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .aggregation import aggregate, masked_mean
from .base import Objective, ObjectiveConfig, param
from .batch import PolicyBatch
from .kl import KL_ESTIMATORS, kl_estimate
from .policy_gradient import clipped_surrogate, entropy_metric, surrogate_metrics

TEPO = "arXiv 2604.12736 (abstract)"  # what the abstract states
READING = "pobench reading of arXiv 2604.12736"  # a value the paper's unavailable equations would fix
GSPO_TOKEN = "arXiv 2507.18071 (GSPO-token: same s_it)"  # s_it is GSPO-token's ratio, so GSPO's clip range
# the clip search range spans both scales: the sequence ratio's (GSPO, 1e-4..2e-3) and the token ratio's (0.2, 0.28 of
# the tepo-token-ratio ablation)


@dataclass(frozen=True)
class TEPOConfig(ObjectiveConfig):
    aggregation: str = param("token-mean", "How per-token terms are reduced: token-level aggregation.", paper=TEPO,
                             choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
    clip_low: float = param(3e-4, "ε_low: lower clip range of s_it (its value is GSPO's ρ_i: GSPO's range).",
                            paper=GSPO_TOKEN, search=(1e-4, 0.4, True))
    clip_high: float = param(4e-4, "ε_high: upper clip range of s_it (its value is GSPO's ρ_i: GSPO's range).",
                             paper=GSPO_TOKEN, search=(1e-4, 0.4, True))
    ratio: str = param("sequence-token", "sequence-token: s_it = sg[ρ_i]·exp(lp − sg[lp]); token: r_it.",
                       paper=TEPO, choices=("sequence-token", "token"))
    kl_coef: float = param(0.04, "β: weight of the masked KL term (0 disables the mask constraint).", paper=READING,
                           search=(1e-3, 1e-1, True), switch=True)
    kl_estimator: str = param("k3", "Per-token KL estimator: k1, k2 or k3.", paper=READING, choices=KL_ESTIMATORS,
                              requires="kl_coef")
    kl_target: str = param("ref", "The masked KL is to the reference (ref) or to the sampling policy (old: a trust "
                                  "region).", paper=READING, choices=("ref", "old"), requires="kl_coef")
    kl_mask: str = param("adv-entropy", "Which tokens get the KL: adv-entropy (both conditions), adv, entropy, all.",
                         paper=TEPO, choices=("adv-entropy", "adv", "entropy", "all"), requires="kl_coef")
    adv_threshold: float = param(0.0, "τ_A: the KL targets tokens with Â_i > τ_A.", paper=READING,
                                 search=(0.0, 1.0, False), requires="kl_coef")
    entropy_threshold: float = param(0.0, "τ_H: ... and with H_θ < H_base − τ_H (decreasing entropy).", paper=READING,
                                     search=(0.0, 0.5, False), requires="kl_coef")
    entropy_baseline: str = param("ref", "H_base: entropy of the reference (ref) or sampling (old) policy.",
                                  paper=READING, choices=("ref", "old"), requires="kl_coef")
    credit: str = param("uniform", "uniform: Â_i on every token; likelihood: scaled by the token's NLL share.",
                        paper=READING, choices=("uniform", "likelihood"))

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_epsilon("clip_low", "clip_high")
        self._check_nonneg("kl_coef", "entropy_threshold")


class TEPOObjective(Objective):
    config_class = TEPOConfig

    def token_advantage_refusal(self) -> str | None:
        return ("its loss builds its own per-token advantages from the per-completion Â_i (likelihood credit) and "
                "masks its KL by Â_i > τ_A")

    def zero_advantage_terms(self) -> tuple[str, ...]:
        """The surrogate is 0 at Â_i = 0 (likelihood credit scales Â_i); the masked KL reaches such a sequence unless
        its mask requires Â_i > τ_A with τ_A >= 0."""
        c = self.config
        if c.kl_coef > 0 and (c.kl_mask in ("all", "entropy") or c.adv_threshold < 0):
            return (f"β·M·KL: the KL mask (kl_mask = {c.kl_mask!r}, τ_A = {c.adv_threshold:g}) reaches tokens with "
                    f"Â = 0 (kl_coef = {c.kl_coef:g})",)
        return ()

    @property
    def batch_fields(self) -> frozenset[str]:
        c = self.config
        if c.kl_coef == 0:
            return super().batch_fields
        fields = {"ref_logprobs"} if c.kl_target == "ref" else set()
        if c.kl_mask in ("adv-entropy", "entropy"):
            fields |= {"entropy", "ref_entropy" if c.entropy_baseline == "ref" else "old_entropy"}
        return super().batch_fields | fields

    @property
    def separable_kl(self) -> float | None:
        c = self.config  # (M ≡ 1 and the reference as target: the masked KL is the plain one)
        return c.kl_coef if c.kl_coef == 0 or (c.kl_mask == "all" and c.kl_target == "ref") else None

    def value_ratio(self, batch: PolicyBatch) -> torch.Tensor:
        """s_it (sequence-token) or r_it (token), (B, T)."""
        log_ratio = batch.logprobs - batch.old_logprobs  # (B, T)
        if self.config.ratio == "token":
            return torch.exp(log_ratio)
        seq = (log_ratio * batch.mask).sum(-1) / batch.mask.sum(-1).clamp(min=1.0)  # (B,)
        return torch.exp(seq.detach())[:, None] * torch.exp(batch.logprobs - batch.logprobs.detach())

    def token_advantages(self, batch: PolicyBatch) -> torch.Tensor:
        """Â_it: Â_i, or Â_i·w_it with likelihood credit. (B, T)"""
        adv = batch.advantages[:, None].expand_as(batch.logprobs)
        if self.config.credit == "uniform":
            return adv
        nll = -batch.old_logprobs.detach() * batch.mask  # (B, T)
        w = batch.mask.sum(-1, keepdim=True) * nll / nll.sum(-1, keepdim=True).clamp(min=1e-12)
        return adv * w

    def kl_mask(self, batch: PolicyBatch) -> torch.Tensor:
        """M_it as a float (B, T) tensor (before the completion mask)."""
        c = self.config
        ones = torch.ones_like(batch.logprobs)
        adv_ok = (batch.advantages[:, None] > c.adv_threshold).to(ones.dtype) * ones
        if c.kl_mask in ("all", "adv"):
            return ones if c.kl_mask == "all" else adv_ok
        h = batch.require("entropy", self.name).detach()
        base = batch.require("ref_entropy" if c.entropy_baseline == "ref" else "old_entropy", self.name)
        ent_ok = (h < base - c.entropy_threshold).to(ones.dtype)
        return ent_ok if c.kl_mask == "entropy" else adv_ok * ent_ok

    def loss(self, batch: PolicyBatch, generator: torch.Generator | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        s = self.value_ratio(batch)
        pg, low, high = clipped_surrogate(s, self.token_advantages(batch), c.clip_low, c.clip_high)  # (B, T)
        per_token = pg
        kl_term = torch.zeros_like(pg)
        masked_frac = torch.zeros(())
        if c.kl_coef > 0:
            m = self.kl_mask(batch)
            target = batch.require("ref_logprobs" if c.kl_target == "ref" else "old_logprobs", self.name)
            kl = kl_estimate(batch.logprobs, target, c.kl_estimator)
            kl_term = c.kl_coef * m * kl
            per_token = per_token + kl_term
            masked_frac = masked_mean(m, batch.mask)
        loss = aggregate(per_token, batch.mask, c.aggregation, batch.max_length)
        metrics = {
            "objective/policy_loss": aggregate(pg, batch.mask, c.aggregation, batch.max_length).detach(),
            "objective/kl_term": aggregate(kl_term, batch.mask, c.aggregation, batch.max_length).detach(),
            "objective/entropy": entropy_metric(batch),
            "objective/masked_frac": masked_frac,
            **surrogate_metrics(s, low, high, batch.mask),
        }
        return loss, metrics
