"""Per-token KL estimators of KL(π_θ ‖ π_ref) from sampled tokens (Schulman, "Approximating KL divergence")."""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate, same shape as the inputs.

    k1 = lp − ref;  k2 = ½ (lp − ref)²;  k3 = exp(ref − lp) − (ref − lp) − 1  (unbiased, non-negative).
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k2":
        return 0.5 * (logprobs - ref_logprobs) ** 2
    if estimator == "k3":
        d = ref_logprobs - logprobs
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
