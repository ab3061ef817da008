"""Example plugin: two objectives of your own (docs/PLUGINS.md).

    bench run --plugin examples/plugins/objectives.py --algos grpo,grpo-nokl,sign-pg,grpo-median --seeds 0

``grpo-nokl`` is GRPO with one field changed (a base plus overrides); ``sign-pg`` has a loss of its own: the clipped
surrogate on the sign of each advantage, so every completion of a group pushes with the same strength. The plugin
also adds an advantage estimator, ``group-median`` (R_i − the group's median reward), which ``grpo-median`` puts
under GRPO's surrogate; any objective can take it with
``--objective-overrides '{"advantage_estimator": "group-median"}'``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import param, register, register_advantage
from algorithms.policy_gradient import PGConfig, PolicyGradient, clipped_surrogate

register("grpo-nokl", base="grpo", description="GRPO without the KL term (example plugin).", kl_coef=0.0)


def median_baseline(rewards: torch.Tensor) -> torch.Tensor:
    """Â_i = R_i − median_g R: a baseline that one outlying reward in a group does not move (example estimator)."""
    return rewards - rewards.median(dim=1, keepdim=True).values


register_advantage("group-median", median_baseline,
                   description="R_i − median of the group's rewards (example plugin estimator).")


@dataclass(frozen=True)
class SignPGConfig(PGConfig):
    clip: float = param(0.2, "ε: the ratio is clipped to [1 − ε, 1 + ε].", search=(0.05, 0.5, True))
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (none by default).",
                           search=(1e-3, 1e-1, True), switch=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.clip < 1:
            self._bad("clip", "must be in (0, 1)")


class SignPG(PolicyGradient):
    """−min(r·sign(Â), clip(r)·sign(Â)) per token: the clipped surrogate with advantages of magnitude 1."""

    config_class = SignPGConfig

    def policy_term(self, batch, ratio, adv, is_w):
        term, low, high = clipped_surrogate(ratio, torch.sign(adv), self.config.clip, self.config.clip)
        return term, low, high, {}


register("sign-pg", SignPG, description="Clipped surrogate on sign(Â) (example plugin).")

register("grpo-median", base="grpo", description="GRPO with the plugin's group-median advantage (example plugin).",
         advantage_estimator="group-median")
