"""TPO, Target Policy Optimization (Kaddour, arXiv 2604.06159), as the author's reference code computes it
(github.com/JeanKaddour/tpo ``src/tpo/algorithms.py`` ``tpo_target``; docs/objectives.md has the reading).

Over the G completions of a prompt (one group, whole in every micro-batch: ``Objective.needs_whole_groups``):

- ℓ_i^θ = Σ_t log π_θ(y_it) (token SUM), p^θ = softmax_i(ℓ^θ);
- u_i = (s_i − mean_g s) / σ_g, σ_g the POPULATION std (1/G, no Bessel, no ε); u = 0 for the whole group when
  σ_g <= ``std_floor`` (1e-6) (``population_standardized``, the advantage estimator);
- target q = softmax_i(ℓ_i^old + u_i/η) (q_i ∝ p_i^old·exp(u_i/η)), detached: fixed for every epoch on the rollout;
- loss: the mean over groups of −Σ_i q_i log p_i^θ (gradient p^θ − q on the ℓ's), plus β·KL(π_θ‖π_ref) per token
  (token mean per completion, mean over completions) when ``kl_coef`` > 0.

An all-equal group has q = p^old: no gradient at θ = θ_old, but gradient p^θ − p^old once θ has moved (a later
minibatch or epoch), so its completions are never skipped (``zero_advantage_terms``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .aggregation import aggregate, masked_mean
from .base import Objective, ObjectiveConfig, param
from .batch import PolicyBatch
from .kl import KL_ESTIMATORS, kl_estimate
from .policy_gradient import entropy_metric

PAPER = "arXiv 2604.06159"
ESTIMATOR = "population-std"


@dataclass(frozen=True)
class TPOConfig(ObjectiveConfig):
    aggregation: str = param("seq-mean-token-mean", "The KL term's reduction (token mean per completion, mean over "
                             "completions); micro-batches are weighted by completions, i.e. by whole groups.",
                             paper=PAPER, choices=("seq-mean-token-mean",))
    advantage_estimator: str = param(ESTIMATOR, "u_i = (s_i − mean_g s)/σ_g, σ_g the population std (1/G, no "
                                     "Bessel, no ε), u = 0 when σ_g <= std_floor; the only value TPO takes.",
                                     paper=PAPER, choices=(ESTIMATOR,))
    eta: float = param(1.0, "η: temperature of the target, q_i ∝ p_i^old·exp(u_i/η) (the paper: η = 1 throughout).",
                       paper=PAPER, search=(0.25, 4.0, True))
    std_floor: float = param(1e-6, "A group whose population reward std is <= this gets u = 0 (the reference code's "
                                   "1e-6).", paper=PAPER)
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (0 disables it; the paper's "
                           "verl GSM8K runs: 1e-3).", paper=PAPER, search=(1e-4, 1e-2, True), switch=True)
    kl_estimator: str = param("k3", "Per-token KL estimator: k1, k2 or k3.", paper="arXiv 2402.03300",
                              choices=KL_ESTIMATORS)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_nonneg("std_floor", "kl_coef")
        if self.eta <= 0:
            self._bad("eta", "must be > 0")


def population_standardized(rewards: torch.Tensor, std_floor: float = 1e-6) -> torch.Tensor:
    """(P, G) rewards -> u = (s − mean_g s) / σ_g with σ_g the population std (1/G), exactly 0 in a group whose σ_g is
    <= ``std_floor``."""
    centred = rewards - rewards.mean(-1, keepdim=True)
    sigma = centred.pow(2).mean(-1, keepdim=True).sqrt()
    flat = sigma <= std_floor
    return torch.where(flat, torch.zeros_like(rewards), centred / torch.where(flat, torch.ones_like(sigma), sigma))


def tpo_target(old_seq_logprobs: torch.Tensor, u: torch.Tensor, eta: float) -> torch.Tensor:
    """(P, G) ℓ^old and u -> the (P, G) target q = softmax_g(ℓ^old + u/η), detached."""
    return torch.softmax(old_seq_logprobs + u / eta, dim=-1).detach()


class TPO(Objective):
    """TPO: cross-entropy from the fixed per-group target q = softmax(ℓ^old + u/η) to p^θ = softmax(ℓ^θ)."""

    config_class = TPOConfig
    needs_whole_groups = True

    @property
    def has_clip(self) -> bool:
        return False  # (a cross-entropy to a fixed target: no clip; its clip fractions are logged as 0)

    @property
    def batch_fields(self) -> frozenset[str]:
        return super().batch_fields | ({"ref_logprobs"} if self.config.kl_coef > 0 else set())

    def zero_advantage_terms(self) -> tuple[str, ...]:
        return ("the softmax over the group couples its completions: a completion with u = 0 has gradient "
                "p^θ − q ≠ 0 once θ has moved from θ_old",)

    def advantages(self, rewards: torch.Tensor, *, lengths: torch.Tensor | None = None,
                   greedy_rewards: torch.Tensor | None = None) -> torch.Tensor:
        """u: the population-standardised rewards of each group (``population_standardized``)."""
        return population_standardized(rewards, self.config.std_floor)

    def loss_weight(self, mask: torch.Tensor, truncated: torch.Tensor | None = None) -> torch.Tensor:
        """The number of completions (whole groups of one size: proportional to the groups the loss averages)."""
        return torch.tensor(float(mask.shape[0]))

    def loss(self, batch: PolicyBatch, generator: torch.Generator | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        G = batch.group_size
        if G is None:
            raise ValueError(f"objective {self.name!r} needs PolicyBatch.group_size (its loss couples the completions "
                             "of a group), which is None")
        c = self.config
        B = batch.logprobs.shape[0]
        m = batch.mask
        shape = (B // G, G)
        ell = (batch.logprobs * m).sum(-1).reshape(shape)  # ℓ^θ: token SUM
        ell_old = (batch.old_logprobs * m).sum(-1).reshape(shape)
        q = tpo_target(ell_old, batch.advantages.reshape(shape).to(ell.dtype), c.eta)
        log_p = torch.log_softmax(ell, dim=-1)
        policy_loss = -(q * log_p).sum(-1).mean()
        loss = policy_loss
        kl_term = torch.zeros((), dtype=ell.dtype)
        if c.kl_coef > 0:
            ref = batch.require("ref_logprobs", self.name)
            kl_term = aggregate(kl_estimate(batch.logprobs, ref, c.kl_estimator), m, c.aggregation, batch.max_length)
            loss = loss + c.kl_coef * kl_term
        ratio = torch.exp(batch.logprobs.detach() - batch.old_logprobs)
        valid = m > 0
        p = log_p.detach().exp()
        zero = torch.zeros((), dtype=ell.dtype)
        metrics = {
            "objective/policy_loss": policy_loss.detach(),
            "objective/kl_term": kl_term.detach(),
            "objective/entropy": entropy_metric(batch),
            "objective/clip_frac_low": zero,
            "objective/clip_frac_high": zero,
            "objective/ratio_mean": masked_mean(ratio, m),
            "objective/ratio_max": ratio[valid].max() if valid.any() else torch.ones(()),
            "objective/target_tv": 0.5 * (p - q).abs().sum(-1).mean(),  # mean over groups of TV(p^θ, q)
        }
        return loss, metrics
