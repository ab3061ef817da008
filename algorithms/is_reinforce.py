"""REINFORCE with a truncated or masked importance weight of the current policy against π_old: verl 0.9.1's policy
loss ``bypass_mode`` with ``loss_type=reinforce`` (``compute_policy_loss_reinforce`` fed by
``compute_rollout_correction_and_rejection_mask``), where π_old is the sampling policy (verl's bypass mode hands the
loss the rollout engine's log-probs as ``old_log_prob``; pobench's native loop does the same with an exact sampler).

Per token, with d_it = sg[lp_it − old_it] (the weight carries no gradient):

    w_it = exp(d_it)                 (``is_level = token``)
    w_i  = exp(Σ_t m_it d_it)        (``is_level = sequence``: the PRODUCT of the token ratios, not their mean)
    w ← min(w, C)                    (``is_mode = truncate``: TIS)    or    w·1[C_low ≤ w ≤ C]  (``mask``: IcePop)
    ℓ_it = −w · Â_i · lp_it          (``is_level = none``: w = 1, plain REINFORCE)

the log-ratio clamped to ±20 (per token, or the per-sequence SUM) only so that exp stays finite, as verl. The
gradient at any θ is −w·Â·∇lp: the truncated / masked IS estimate of the on-policy gradient from π_old's samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .aggregation import AGGREGATIONS
from .base import param
from .correction import LOG_CLAMP
from .policy_gradient import PGConfig, PolicyGradient

IS_LEVELS = ("sequence", "token", "none")
IS_MODES = ("truncate", "mask")
BYPASS = "verl 0.9.1 bypass_mode, loss_type=reinforce (RolloutCorrectionConfig)"


@dataclass(frozen=True)
class ISReinforceConfig(PGConfig):
    aggregation: str = param("token-mean", "How per-token terms are reduced to the loss (verl bypass_mode: "
                             "token-mean).", paper=BYPASS, choices=AGGREGATIONS)
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (verl's bypass loss has none).",
                           paper=BYPASS, search=(1e-3, 1e-1, True), switch=True)
    is_level: str = param("sequence", "IS weight π_θ/π_old per sequence (product of the token ratios), per token, or "
                          "none (plain −Â·lp) (verl rollout_is; its default and bypass_pg_is: sequence).",
                          paper=BYPASS, choices=IS_LEVELS)
    is_mode: str = param("truncate", "truncate: w ← min(w, C) (TIS); mask: w ← w·1[C_low ≤ w ≤ C] (IcePop) (verl "
                         "rollout_is_threshold 'C' or 'C_low_C').", paper=BYPASS, choices=IS_MODES)
    is_cap: float = param(2.0, "C: upper threshold of the IS weight (verl rollout_is_threshold, default 2).",
                          paper=BYPASS, search=(1.2, 10.0, True))
    is_floor: float = param(0.5, "C_low: lower threshold of is_mode=mask (verl bypass_pg_token_icepop: 0.5).",
                            paper=BYPASS)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ratio_level != "token":
            self._bad("ratio_level", "the IS weight has its own level (is_level): must be 'token'")
        if self.is_cap <= 0:
            self._bad("is_cap", "must be > 0")
        if not 0.0 <= self.is_floor < self.is_cap:
            self._bad("is_floor", f"must be in [0, is_cap={self.is_cap!r})")
        if self.is_mode == "truncate" and self.is_floor != 0.5:
            self._bad("is_floor", "acts only with is_mode='mask'; leave it at 0.5")
        if self.is_level == "none" and (self.is_mode, self.is_cap) != ("truncate", 2.0):
            self._bad("is_level", "without an IS weight is_mode and is_cap do not act; leave them at 'truncate', 2.0")


class ISReinforce(PolicyGradient):
    """−sg[w]·Â·lp with w the truncated / masked IS weight of π_θ against π_old (module docstring)."""

    config_class = ISReinforceConfig
    policy_term_vanishes_at_zero_advantage = True  # −w·Â·lp, w finite

    @property
    def has_clip(self) -> bool:
        """No cut without an IS weight (``is_level = none``): its clip fractions are then 0 by construction. (With
        ``is_mode = truncate`` nothing is cut below: ``clip_frac_low`` is 0 by construction, as CISPO's at
        ε_low = 1.)"""
        return self.config.is_level != "none"

    def policy_term(self, batch, ratio, adv, is_w):
        c, mask = self.config, batch.mask
        none = torch.zeros_like(mask, dtype=torch.bool)
        if c.is_level == "none":
            return -adv * batch.logprobs, none, none, {}
        d = (batch.logprobs - batch.old_logprobs).detach()
        if c.is_level == "sequence":
            d = (d * mask).sum(-1, keepdim=True)  # (B, 1)
        raw = torch.exp(d.clamp(-LOG_CLAMP, LOG_CLAMP))
        high = raw > c.is_cap
        if c.is_mode == "truncate":
            w, low = raw.clamp(max=c.is_cap), torch.zeros_like(high)
        else:
            low = raw < c.is_floor
            w = raw.masked_fill(low | high, 0.0)
        return -w * adv * batch.logprobs, low.expand_as(mask), high.expand_as(mask), {}
