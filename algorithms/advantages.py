"""Advantage estimators from grouped scalar rewards (one group = the G completions of one prompt)."""

from __future__ import annotations

import torch

ADVANTAGE_ESTIMATORS = ("group", "group-no-std")
STD_EPS = 1e-6


def group_advantages(rewards: torch.Tensor, estimator: str) -> torch.Tensor:
    """Advantages for rewards of shape (P, G): one row per prompt.

    - ``group``: Â_i = (R_i − mean_g R) / (std_g R + 1e-6)  (GRPO, arXiv 2402.03300; std with Bessel's correction,
      as in TRL)
    - ``group-no-std``: Â_i = R_i − mean_g R  (Dr. GRPO, arXiv 2503.20783)
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (prompts, group_size), got {tuple(rewards.shape)}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (P, G)
    if estimator == "group-no-std":
        return centred
    if estimator == "group":
        std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(rewards[:, :1])
        return centred / (std + STD_EPS)
    raise ValueError(f"unknown advantage estimator {estimator!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}")
