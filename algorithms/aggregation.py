"""The ONE aggregation function: how a (B, T) per-token loss becomes a scalar, for every objective."""

from __future__ import annotations

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum")


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, max_length: int) -> torch.Tensor:
    """Reduce per-token ``values`` (B, T) over completion tokens (``mask``) to a scalar.

    - ``token-mean``: Σ_i Σ_t m ℓ / Σ_i Σ_t m  (DAPO, arXiv 2503.14476)
    - ``seq-mean-token-mean``: mean_i (Σ_t m ℓ / |y_i|)  (GRPO, arXiv 2402.03300)
    - ``seq-mean-token-sum-norm``: Σ_i Σ_t m ℓ / (B · L_max)  (Dr. GRPO, arXiv 2503.20783)
    - ``seq-mean-token-sum``: mean_i Σ_t m ℓ  (LUSPO, arXiv 2602.05261: each sequence weighted by its length)
    """
    masked = values * mask  # (B, T)
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
        return per_seq.mean()
    if mode == "seq-mean-token-sum-norm":
        return masked.sum() / (values.shape[0] * max_length)
    if mode == "seq-mean-token-sum":
        return masked.sum() / values.shape[0]
    raise ValueError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")


def aggregation_weight(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Weight of one micro-batch when several are combined: full = Σ_k w_k·loss_k / Σ_k w_k.

    Token count for ``token-mean``; number of sequences for the two sequence-level modes.
    """
    if mode == "token-mean":
        return mask.sum()
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum"):
        return torch.tensor(float(mask.shape[0]))
    raise ValueError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean of ``values`` over ``mask`` (for metrics)."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)
