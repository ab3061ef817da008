"""PPO with a learned value function (critic) and GAE (Schulman et al., arXiv 1707.06347 and 1506.02438): the classic
RLVR baseline, verl's default ``algorithm.adv_estimator=gae``.

The policy side is GRPO's clipped token-ratio surrogate (``ClippedPG``) on per-token advantages Â_it
(``PolicyBatch.token_advantages``) instead of one advantage per completion broadcast over its tokens. The advantages
come from the critic: the engine scores V(s_t) of every sampled completion before the update, and
``advantages_from_values`` turns the outcome reward (on the last token) and those values into GAE's whitened
advantages and the returns the critic is trained towards with the clipped ``value_loss`` (algorithms/critic.py).
The critic itself (a copy of the policy with a scalar value head, its optimizer, learning rate and warm-up) is what
``critic`` declares; the engine builds, trains and checkpoints it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import param
from .critic import CriticSpec, gae, outcome_token_rewards, value_loss
from .policy_gradient import ClippedPG, ClippedPGConfig

GAE_PAPER = "arXiv 1506.02438"
VERL_CRITIC = "verl 0.9.1 critic defaults"


@dataclass(frozen=True)
class PPOConfig(ClippedPGConfig):
    """PPO: the clipped surrogate on GAE advantages, and the critic's settings."""

    gamma: float = param(1.0, "γ: GAE's discount (verl algorithm.gamma).", paper=GAE_PAPER)
    lam: float = param(1.0, "λ: GAE's trace decay; 1: Â_t = G_t − V(s_t) (verl algorithm.lam).", paper=GAE_PAPER,
                       search=(0.9, 1.0, False))
    value_clip: float = param(0.5, "c_V: the value loss clips V_θ to V_old ± c_V and takes the larger error (verl "
                              "critic.cliprange_value; 0: no clip).", paper=VERL_CRITIC)
    critic_lr: float = param(1e-5, "Learning rate of the critic's AdamW, constant (verl critic.optim.lr).",
                             paper=VERL_CRITIC, search=(1e-6, 1e-3, True))
    critic_weight_decay: float = param(0.01, "Weight decay of the critic's AdamW (verl critic.optim.weight_decay).",
                                       paper=VERL_CRITIC)
    critic_warmup: int = param(0, "The first N training steps update the critic only, not the policy (verl "
                               "trainer.critic_warmup counts N + 1: see docs/objectives.md).", paper=VERL_CRITIC)
    critic_max_grad_norm: float = param(1.0, "Gradient-norm clip of the critic's update (verl critic.grad_clip; 0: "
                                        "no clip).", paper=VERL_CRITIC)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_fraction("gamma", "lam")
        self._check_nonneg("value_clip", "critic_weight_decay", "critic_warmup", "critic_max_grad_norm")
        if not self.critic_lr > 0:
            self._bad("critic_lr", "must be > 0")
        if self.advantage_estimator != "group":
            self._bad("advantage_estimator", "PPO's advantages are GAE's, from the critic's values: this field is not "
                                             "read; leave it at 'group'")
        if self.off_policy_mask_threshold != 0:
            self._bad("off_policy_mask_threshold", "the off-policy sequence mask reads one advantage per completion, "
                                                   "and PPO's are per token; leave it at 0")


class PPO(ClippedPG):
    """PPO with a critic: ClippedPG's loss on per-token GAE advantages; the critic it declares is the engine's."""

    config_class = PPOConfig

    @property
    def uses_token_advantages(self) -> bool:
        return True

    def token_advantage_refusal(self) -> str | None:
        return "PPO's per-token advantages are GAE's, from its critic's values"

    @property
    def critic(self) -> CriticSpec:
        c = self.config
        return CriticSpec(lr=c.critic_lr, weight_decay=c.critic_weight_decay, warmup_steps=c.critic_warmup,
                          max_grad_norm=c.critic_max_grad_norm)

    def advantages(self, rewards: torch.Tensor, *, lengths: torch.Tensor | None = None,
                   greedy_rewards: torch.Tensor | None = None) -> torch.Tensor:
        """The rewards themselves: no per-completion estimator is applied (the per-token advantages are
        ``advantages_from_values``', once the critic has scored the completions)."""
        return rewards.clone()

    def advantages_from_values(self, rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE (γ, λ) with the outcome reward on each completion's last token, whitened over the batch's completion
        tokens; returns Â + V before whitening."""
        c = self.config
        return gae(outcome_token_rewards(rewards.to(values.dtype), mask), values, mask, c.gamma, c.lam)

    def value_loss(self, values: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor, mask: torch.Tensor,
                   max_length: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return value_loss(values, returns, old_values, mask, self.config.value_clip, self.config.aggregation,
                          max_length)
