"""Example plugin: two objectives of your own (docs/PLUGINS.md).

    bench run --plugin examples/plugins/objectives.py --algos grpo,grpo-nokl,sign-pg --seeds 0

``grpo-nokl`` is GRPO with one field changed (a base plus overrides); ``sign-pg`` has a loss of its own: the clipped
surrogate on the sign of each advantage, so every completion of a group pushes with the same strength.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import param, register
from algorithms.policy_gradient import PGConfig, PolicyGradient, clipped_surrogate

register("grpo-nokl", base="grpo", description="GRPO without the KL term (example plugin).", kl_coef=0.0)


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
