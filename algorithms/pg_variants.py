"""Policy terms other than the clipped surrogate, on the shared ``PolicyGradient`` skeleton (KL, entropy bonus,
aggregation, rollout correction and the batch options come from there):

- CISPO (arXiv 2506.13585): −sg[clip(r, 1 − ε_low, 1 + ε_high)] · Â · lp
- SAPO (arXiv 2511.20347): −(4/τ) σ(τ (r − 1)) · Â, τ = τ_pos if Â > 0 else τ_neg
- GMPO (arXiv 2507.20673): −Â · exp(mean_t sgn(Â)·min(sgn(Â) log r, sgn(Â) clip(log r, −ε_low, ε_high))), per sequence
- GPG (arXiv 2504.02546): −Â · lp
- VESPO (arXiv 2602.10693): −sg[φ(w_i)] · Â · lp, w_i = exp(Σ_t m (lp − old)), φ(w) = e^λ w^k e^{−λ w}
- TOPR (arXiv 2503.14286): −sg[w_i] · Â · lp, w_i = 1 if Â_i ≥ 0 else clip(π_θ(y_i)/π_old(y_i), 0, 1)
- DPPO (arXiv 2602.04879, verl ``dppo_tv`` / ``dppo_kl``): −sg[M_it · min(r_it, C)] · Â · lp, M_it = 0 on tokens whose
  binary divergence between π_θ(y_t) and π_old(y_t) left the trust region δ in the direction Â pushes
- DRO (arXiv 2405.19107, verl ``dro``): −(Â · lp − ½ β (lp − old)²)
- CFPO (arXiv 2601.22801, its authors' verl PR #5252): −(r · Â − |Â| · (r − 1)² / (2ε)), no clip
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .advantages import estimator_names
from .aggregation import AGGREGATIONS, masked_mean
from .base import param
from .policy_gradient import ClippedPG, ClippedPGConfig, PGConfig, PolicyGradient


def _no_clip(batch):
    z = torch.zeros_like(batch.mask, dtype=torch.bool)
    return z, z


@dataclass(frozen=True)
class CISPOConfig(PGConfig):
    aggregation: str = param("token-mean", "How per-token terms are reduced to the loss (CISPO: token-mean).",
                             paper="arXiv 2506.13585", choices=AGGREGATIONS)
    clip_low: float = param(1.0, "ε_low: the IS weight is clipped below at 1 − ε_low (1 = no lower bound, as "
                            "MiniMax-M1 and TRL).", paper="arXiv 2506.13585")
    clip_high: float = param(4.0, "ε_high: the IS weight is clipped above at 1 + ε_high (ScaleRL / TRL ε_max = 5).",
                             paper="arXiv 2510.13786", search=(0.2, 8.0, True))
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (CISPO uses none).",
                           paper="arXiv 2506.13585", search=(1e-3, 1e-1, True), switch=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (0.0 < self.clip_low <= 1.0):
            self._bad("clip_low", "must be in (0, 1]")
        if self.clip_high <= 0:
            self._bad("clip_high", "must be > 0")


class CISPO(PolicyGradient):
    """Clipped IS-weight policy optimization: the clipped ratio is a constant weight on Â·∇lp; no token loses its
    gradient."""

    config_class = CISPOConfig
    policy_term_vanishes_at_zero_advantage = True  # −sg[w]·Â·lp

    def policy_term(self, batch, ratio, adv, is_w):
        c = self.config
        w = torch.clamp(ratio, 1.0 - c.clip_low, 1.0 + c.clip_high).detach()
        low = (ratio < 1.0 - c.clip_low).expand_as(batch.mask)
        high = (ratio > 1.0 + c.clip_high).expand_as(batch.mask)
        return -w * adv * batch.logprobs, low, high, {}


@dataclass(frozen=True)
class SAPOConfig(PGConfig):
    tau_pos: float = param(1.0, "τ_pos: gate temperature for Â > 0.", paper="arXiv 2511.20347",
                           search=(0.25, 4.0, True))
    tau_neg: float = param(1.05, "τ_neg: gate temperature for Â ≤ 0.", paper="arXiv 2511.20347",
                           search=(0.25, 4.0, True))
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (SAPO uses none).",
                           paper="arXiv 2511.20347", search=(1e-3, 1e-1, True), switch=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("tau_pos", "tau_neg"):
            if getattr(self, name) <= 0:
                self._bad(name, "must be > 0")


class SAPO(PolicyGradient):
    """Soft adaptive policy optimization: a sigmoid gate of the ratio replaces the hard clip (gradient at r = 1
    equals the plain policy gradient for any τ)."""

    config_class = SAPOConfig

    @property
    def has_clip(self) -> bool:
        return False  # (no clip: its clip fractions are 0 by construction)
    policy_term_vanishes_at_zero_advantage = True  # −(4/τ)σ(τ(r − 1))·Â

    def policy_term(self, batch, ratio, adv, is_w):
        c = self.config
        tau = torch.where(adv > 0, torch.full_like(adv, c.tau_pos), torch.full_like(adv, c.tau_neg))
        gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
        return -gate * adv, *_no_clip(batch), {}


@dataclass(frozen=True)
class GMPOConfig(PGConfig):
    clip_low: float = param(0.4, "ε_low: log r is clipped below at −ε_low (ratio range (e^−0.4, e^0.4)).",
                            paper="arXiv 2507.20673", search=(0.1, 1.0, False))
    clip_high: float = param(0.4, "ε_high: log r is clipped above at ε_high.", paper="arXiv 2507.20673",
                             search=(0.1, 1.0, False))
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (GMPO uses none).",
                           paper="arXiv 2507.20673", search=(1e-3, 1e-1, True), switch=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ratio_level != "token":
            self._bad("ratio_level", "GMPO clips token ratios before their geometric mean: must be 'token'")
        for name in ("clip_low", "clip_high"):
            if getattr(self, name) <= 0:
                self._bad(name, "must be > 0")


class GMPO(PolicyGradient):
    """Geometric-mean policy optimization: the sequence ratio is the geometric mean of token-clipped ratios.
    With the default seq-mean-token-mean aggregation the loss is mean_i (the per-sequence term), as in verl."""

    config_class = GMPOConfig
    policy_term_vanishes_at_zero_advantage = True  # −Â·exp(mean_t sgn(Â)·…) = −Â·1 at Â = 0
    folds_is_weights = True

    def token_advantage_refusal(self) -> str | None:
        return ("its term is −Â_i times one sequence ratio, the geometric mean over the tokens clipped by the sign "
                "of Â_i: one advantage per completion")

    def policy_term(self, batch, ratio, adv, is_w):
        c = self.config
        log_r = batch.logprobs - batch.old_logprobs
        sgn = torch.sign(adv)
        clamped = torch.clamp(log_r, -c.clip_low, c.clip_high)
        log_min = sgn * torch.min(sgn * log_r, sgn * clamped)
        n = batch.mask.sum(-1, keepdim=True).clamp(min=1.0)
        seq_ratio = torch.exp((log_min * batch.mask).sum(-1, keepdim=True) / n)  # (B, 1)
        term = -adv * seq_ratio
        if is_w is not None:  # rollout correction: geometric mean of the token weights per sequence (as verl)
            log_w = torch.log(is_w + 1e-10)
            term = term * (torch.exp((log_w * batch.mask).sum(-1, keepdim=True) / n) if log_w.shape[1] > 1
                           else is_w)
        clipped = log_r != clamped
        return term, clipped & (adv < 0), clipped & (adv > 0), {}


@dataclass(frozen=True)
class GPGConfig(PGConfig):
    aggregation: str = param("token-mean", "How per-token terms are reduced to the loss (GPG: token-mean).",
                             paper="arXiv 2504.02546", choices=AGGREGATIONS)
    advantage_estimator: str = param("gpg", "Advantage from grouped rewards (algorithms/advantages.py).",
                                     paper="arXiv 2504.02546",
                                     choices=estimator_names)
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (GPG uses none).",
                           paper="arXiv 2504.02546", search=(1e-3, 1e-1, True), switch=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ratio_level != "token":
            self._bad("ratio_level", "GPG has no importance ratio: must be 'token'")


class GPG(PolicyGradient):
    """Group policy gradient: plain REINFORCE on the group advantage, no ratio, no clip."""

    config_class = GPGConfig

    @property
    def has_clip(self) -> bool:
        return False  # (no clip: its clip fractions are 0 by construction)
    policy_term_vanishes_at_zero_advantage = True  # −Â·lp

    def policy_term(self, batch, ratio, adv, is_w):
        return -adv * batch.logprobs, *_no_clip(batch), {}


@dataclass(frozen=True)
class VESPOConfig(PGConfig):
    aggregation: str = param("token-mean", "How per-token terms are reduced to the loss (VESPO: token-mean, as TRL).",
                             paper="arXiv 2602.10693", choices=AGGREGATIONS)
    k_pos: float = param(2.0, "k for Â ≥ 0: power of w in φ (down-weights w < 1).", paper="arXiv 2602.10693",
                         search=(0.5, 6.0, False))
    lambda_pos: float = param(3.0, "λ for Â ≥ 0: exponential decay of φ (down-weights w > 1).",
                              paper="arXiv 2602.10693", search=(0.5, 6.0, False))
    k_neg: float = param(3.0, "k for Â < 0.", paper="arXiv 2602.10693", search=(0.5, 6.0, False))
    lambda_neg: float = param(2.0, "λ for Â < 0.", paper="arXiv 2602.10693", search=(0.5, 6.0, False))
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (VESPO uses none).",
                           paper="arXiv 2602.10693", search=(1e-3, 1e-1, True), switch=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ratio_level != "token":
            self._bad("ratio_level", "VESPO's weight is built from the sequence ratio itself: must be 'token'")
        if self.rollout_correction.startswith("sequence"):
            self._bad("rollout_correction", "VESPO folds token-level IS weights into w: use none or token-*")
        self._check_nonneg("k_pos", "lambda_pos", "k_neg", "lambda_neg")


class VESPO(PolicyGradient):
    """Variational sequence-level soft policy optimization: a detached Gamma-shaped weight of the (product) sequence
    ratio, φ(1) = 1, scales Â·∇lp. Rollout-correction weights enter w (as TRL), not the loss."""

    config_class = VESPOConfig

    @property
    def has_clip(self) -> bool:
        return False  # (no clip: its clip fractions are 0 by construction)
    policy_term_vanishes_at_zero_advantage = True  # −sg[φ]·Â·lp, φ finite (nan_to_num)
    folds_is_weights = True

    def token_advantage_refusal(self) -> str | None:
        return ("its weight φ of the sequence ratio takes its shape (k, λ) from the sign of the per-completion Â_i: "
                "one weight per completion")

    def policy_term(self, batch, ratio, adv, is_w):
        c = self.config
        floor = math.log(1e-8)
        log_r = torch.clamp(batch.logprobs - batch.old_logprobs, -20.0, 20.0).detach()
        seq = (log_r * batch.mask).sum(-1, keepdim=True)  # (B, 1)
        if is_w is not None:
            seq = seq + (torch.clamp(torch.log(is_w), floor, 20.0) * batch.mask).sum(-1, keepdim=True)
        log_w = torch.clamp(seq, floor, 20.0)
        nonneg = adv >= 0
        k = torch.where(nonneg, torch.full_like(adv, c.k_pos), torch.full_like(adv, c.k_neg))
        lam = torch.where(nonneg, torch.full_like(adv, c.lambda_pos), torch.full_like(adv, c.lambda_neg)).clamp(
            min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        metrics = {"objective/vespo_weight_mean": phi.mean()}
        return -phi * adv * batch.logprobs, *_no_clip(batch), metrics


TAPER_RATIOS = ("sequence", "sequence-mean")


@dataclass(frozen=True)
class TOPRConfig(PGConfig):
    aggregation: str = param("seq-mean-token-sum", "How per-token terms are reduced to the loss (TOPR: the gradient of "
                             "the sequence log-likelihood Σ_t lp, averaged over sequences).", paper="arXiv 2503.14286",
                             choices=AGGREGATIONS)
    advantage_estimator: str = param("group-no-std", "Advantage from grouped rewards (algorithms/advantages.py; TOPR: "
                                     "reward minus a baseline, unscaled; here the group mean).",
                                     paper="arXiv 2503.14286", choices=estimator_names)
    taper_ratio: str = param("sequence", "Ratio truncated to [0, 1] on Â < 0: 'sequence' π_θ(y)/π_old(y) = "
                             "exp(Σ_t (lp − old)) (paper), 'sequence-mean' exp(mean_t (lp − old)) (verl PR #6986).",
                             paper="arXiv 2503.14286", choices=TAPER_RATIOS)
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (TOPR uses none).",
                           paper="arXiv 2503.14286", search=(1e-3, 1e-1, True), switch=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ratio_level != "token":
            self._bad("ratio_level", "TOPR's weight is built from the sequence ratio itself (taper_ratio): must be "
                                     "'token'")


class TOPR(PolicyGradient):
    """Tapered off-policy REINFORCE: a sequence with Â ≥ 0 gets the plain REINFORCE gradient −Â·∇lp (no importance
    weight), a sequence with Â < 0 the same scaled by its sequence ratio truncated to [0, 1] and detached, so an
    off-policy negative keeps a bounded gradient instead of losing it (PPO's clip) or blowing up (plain IS)."""

    config_class = TOPRConfig

    @property
    def has_clip(self) -> bool:
        return False  # (no clip: its clip fractions are 0 by construction)
    policy_term_vanishes_at_zero_advantage = True  # −sg[w]·Â·lp with w ∈ [0, 1]

    def token_advantage_refusal(self) -> str | None:
        return ("it tapers a whole completion (its sequence ratio truncated at 1) by the sign of the per-completion "
                "Â_i")

    def policy_term(self, batch, ratio, adv, is_w):
        log_r = ((batch.logprobs - batch.old_logprobs).detach() * batch.mask).sum(-1, keepdim=True)  # (B, 1)
        if self.config.taper_ratio == "sequence-mean":
            log_r = log_r / batch.mask.sum(-1, keepdim=True).clamp(min=1.0)
        tapered = log_r > 0  # ratio > 1: truncated at 1
        w = torch.where(adv < 0, torch.exp(log_r.clamp(max=0.0)), torch.ones_like(adv))  # (B, 1), no overflow
        taper = ((adv < 0) & tapered).expand_as(batch.mask).to(batch.mask.dtype)
        metrics = {"objective/taper_frac": (taper * batch.mask).sum() / batch.mask.sum().clamp(min=1.0)}
        return -w * adv * batch.logprobs, *_no_clip(batch), metrics


@dataclass(frozen=True)
class DPPOConfig(PGConfig):
    aggregation: str = param("token-mean", "How per-token terms are reduced to the loss (DPPO: token-mean, verl's "
                             "default).", paper="arXiv 2602.04879", choices=AGGREGATIONS)
    delta_low: float = param(0.2, "δ_low: a token with Â ≤ 0 leaves the gradient once π_θ(y_t) − π_old(y_t) < −δ_low "
                             "(verl clip_ratio_low; 0.2 as the open-instruct and prime-rl ports).",
                             paper="arXiv 2602.04879", search=(0.05, 0.5, True))
    delta_high: float = param(0.2, "δ_high: a token with Â > 0 leaves the gradient once π_θ(y_t) − π_old(y_t) > "
                              "δ_high (verl clip_ratio_high; 0.2 as the open-instruct and prime-rl ports).",
                              paper="arXiv 2602.04879", search=(0.05, 0.5, True))
    ratio_cap: float = param(20.0, "C: the detached weight is min(r, C), truncated IS (verl clip_ratio_c; its "
                             "fallback 20: a large C, arXiv 2602.04879 section 5.4).", paper="arXiv 2602.04879",
                             search=(2.0, 100.0, True))
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (DPPO uses none).",
                           paper="arXiv 2602.04879", search=(1e-3, 1e-1, True), switch=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ratio_level != "token":
            self._bad("ratio_level", "DPPO's trust region is per token: must be 'token'")
        for name in ("delta_low", "delta_high"):
            if getattr(self, name) <= 0:
                self._bad(name, "must be > 0")
        if self.ratio_cap <= 1.0:
            self._bad("ratio_cap", "must be > 1")


@dataclass(frozen=True)
class DPPOKLConfig(DPPOConfig):
    delta_low: float = param(0.05, "δ_low: a token with Â ≤ 0 whose probability fell (π_θ(y_t) < π_old(y_t)) leaves "
                             "the gradient once the binary KL exceeds δ_low (verl clip_ratio_low; 0.05 as the "
                             "open-instruct port).",
                             paper="arXiv 2602.04879", search=(0.005, 0.2, True))
    delta_high: float = param(0.05, "δ_high: a token with Â > 0 whose probability rose leaves the gradient once the "
                              "binary KL exceeds δ_high (verl clip_ratio_high; 0.05 as the open-instruct port).",
                              paper="arXiv 2602.04879",
                              search=(0.005, 0.2, True))


class DPPOTV(PolicyGradient):
    """Divergence PPO, binary total-variation trust region: REINFORCE weighted by the detached truncated ratio, where
    a token whose probability moved more than δ (in the direction its advantage pushes it) loses its gradient. The
    divergence is that of the two-outcome distribution (y_t, not y_t): its TV is |π_θ(y_t) − π_old(y_t)|."""

    config_class = DPPOConfig
    policy_term_vanishes_at_zero_advantage = True  # −sg[M·min(r, C)]·Â·lp

    def outside(self, p: torch.Tensor, p_old: torch.Tensor, lp: torch.Tensor, old: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(out of the region upwards, out of it downwards): the masks for Â > 0 and for Â ≤ 0."""
        c = self.config
        return p - p_old > c.delta_high, p - p_old < -c.delta_low

    def policy_term(self, batch, ratio, adv, is_w):
        c = self.config
        lp, old = batch.logprobs.detach(), batch.old_logprobs
        up, down = self.outside(torch.exp(lp), torch.exp(old), lp, old)
        positive = adv > 0
        out = torch.where(positive, up, down)  # (B, T)
        # r = exp(lp − old) with the log-ratio clamped to ±20 as verl does, truncated at C; detached
        raw = torch.exp((lp - old).clamp(-20.0, 20.0))
        weight = raw.clamp(max=c.ratio_cap)
        truncated = (raw > c.ratio_cap) & ~out
        term = -(weight * (~out).to(weight.dtype)) * adv * batch.logprobs
        metrics = {"objective/ratio_truncated_frac": masked_mean(truncated.to(batch.mask.dtype), batch.mask)}
        return term, out & ~positive, out & positive, metrics


class DPPOKL(DPPOTV):
    """Divergence PPO, binary KL trust region: as ``DPPOTV`` with KL(Bern(π_old(y_t)) ‖ Bern(π_θ(y_t))) in place of
    the TV, and a token leaves only while its probability moves the way its advantage pushes it."""

    config_class = DPPOKLConfig

    def outside(self, p, p_old, lp, old):
        c = self.config
        # 1e-8 inside the log of the complement, as verl (π → 1 stays finite)
        kl = p_old * (old - lp) + (1.0 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
        return (kl > c.delta_high) & (p > p_old), (kl > c.delta_low) & (p < p_old)


@dataclass(frozen=True)
class DROConfig(PGConfig):
    aggregation: str = param("token-mean", "How per-token terms are reduced to the loss (verl dro: its default "
                             "token-mean).", paper="arXiv 2405.19107", choices=AGGREGATIONS)
    beta: float = param(0.05, "β: weight of the quadratic penalty ½β(lp − old)² on every token (verl dro_beta, "
                        "no default there; 0.05 in the PR that added it, verl #7245).", paper="arXiv 2405.19107",
                        search=(5e-3, 0.5, True))
    kl_coef: float = param(0.0, "β_KL: weight of the per-token KL to the reference policy (DRO as verl: none).",
                           paper="arXiv 2405.19107", search=(1e-3, 1e-1, True), switch=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ratio_level != "token":
            self._bad("ratio_level", "DRO has no importance ratio: must be 'token'")
        if self.beta <= 0:
            self._bad("beta", "must be > 0 (verl refuses dro_beta <= 0)")


class DRO(PolicyGradient):
    """Direct reward optimization as verl's ``dro`` loss: REINFORCE −Â·lp plus a quadratic penalty ½β(lp − old)² that
    pulls every token back to the sampling policy (the regulariser of DRO's squared loss, taken to π_old)."""

    config_class = DROConfig

    @property
    def has_clip(self) -> bool:
        return False  # (no clip: its clip fractions are 0 by construction)

    def zero_advantage_terms(self) -> tuple[str, ...]:
        own = f"the penalty ½β(lp − old)² on every token (beta = {self.config.beta:g})"
        return tuple(own if t.startswith("the policy term") else t for t in super().zero_advantage_terms())

    def policy_term(self, batch, ratio, adv, is_w):
        log_r = batch.logprobs - batch.old_logprobs
        term = -(adv * batch.logprobs - 0.5 * self.config.beta * log_r.square())
        return term, *_no_clip(batch), {}


@dataclass(frozen=True)
class UPConfig(ClippedPGConfig):
    dual_clip_c: float = param(3.0, "c: dual clip of the Â ≤ 0 branch, the loss of a token with Â < 0 is at most "
                               "−c·Â (verl PR #7022: its clip_ratio_c, 3; 0 disables it, TRL PR #6579's default).",
                               paper="arXiv 2607.06987", search=(1.5, 10.0, True), switch=True)


class UP(ClippedPG):
    """Unbounded Positive asymmetric optimization (UP-GRPO): a token of a completion with Â > 0 gets the plain,
    self-anchored REINFORCE term −Â·π_θ/sg(π_θ) (value −Â, gradient −Â·∇lp: no π_old anchor, no upper clip, so a
    rare correct token keeps its full gradient); a token with Â ≤ 0 the GRPO clipped surrogate with dual clip."""

    config_class = UPConfig
    policy_term_vanishes_at_zero_advantage = True  # −Â·r̃ and the clipped surrogate are both 0 at Â = 0

    def policy_term(self, batch, ratio, adv, is_w):
        term, low, high, metrics = super().policy_term(batch, ratio, adv, is_w)
        positive = (adv > 0).expand_as(term)
        anchored = torch.exp(batch.logprobs - batch.logprobs.detach())  # 1 in value, ∇lp in gradient
        term = torch.where(positive, -adv * anchored, term)
        metrics["objective/unbounded_frac"] = masked_mean(positive.to(batch.mask.dtype), batch.mask)
        return term, low, high & ~positive, metrics


@dataclass(frozen=True)
class CFPOConfig(PGConfig):
    tv_eps: float = param(0.2, "ε: the trust region the quadratic penalty |Â|·(r − 1)²/(2ε) enforces in place of the "
                          "clip; a token's objective peaks at r = 1 + sign(Â)·ε, PPO's clip edge (the authors' verl "
                          "PR #5252 reads verl's symmetric clip_ratio, 0.2).", paper="arXiv 2601.22801",
                          search=(0.05, 0.4, False))

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_epsilon("tv_eps")


#: |log r| beyond which the authors' code clamps the log-ratio before exp (verl PR #5252: ±20); its gradient is 0 there
CFPO_LOG_RATIO_CLAMP = 20.0


class CFPO(PolicyGradient):
    """Clipping-free policy optimization: the clipped surrogate is replaced by r·Â − |Â|·(r − 1)²/(2ε), a concave
    function of r with its maximum at r = 1 + sign(Â)·ε (where PPO's clip starts). Inside that point the gradient
    pushes r towards it, past it the penalty pulls r back (the clip would only stop it): no zero-gradient region."""

    config_class = CFPOConfig
    policy_term_vanishes_at_zero_advantage = True  # both terms carry the factor Â or |Â|

    def policy_term(self, batch, ratio, adv, is_w):
        eps = self.config.tv_eps
        r = ratio.clamp(math.exp(-CFPO_LOG_RATIO_CLAMP), math.exp(CFPO_LOG_RATIO_CLAMP))
        term = -(r * adv - adv.abs() * (r - 1.0).square() / (2.0 * eps))
        shape = batch.logprobs.shape
        # past the penalty's optimum on the advantage's side: the tokens PPO's clip would stop, which CFPO pulls back
        high = ((r > 1.0 + eps) & (adv > 0)).expand(shape)
        low = ((r < 1.0 - eps) & (adv < 0)).expand(shape)
        return term.expand(shape), low, high, {}
