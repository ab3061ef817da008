"""Batch-level options every policy-gradient objective accepts: truncated-completion masking, the off-policy
sequence mask, and the rollout-mismatch correction (sampler vs trainer log-probs).

``prepare(batch, config)`` returns the batch with its mask narrowed (truncated completions), the per-token weights
that multiply the objective's policy term (IS weights × off-policy mask; ``None`` when all are 1), and metrics.

Rollout mismatch: the sampler (vLLM, or any engine whose numerics differ) reports log-probs ``s`` of the tokens it
sampled; the trainer recomputes ``old`` for the same policy. The per-token IS weight is w_it = exp(old − s) (token
modes) or w_i = exp(Σ_t m (old − s)) (sequence modes; the SUM is clamped to ±20 before exp, never its tokens), and
(TRL ``vllm_importance_sampling_mode``, verl rollout correction, arXiv 2512.02556 / Yao et al. "Your efficient RL
framework secretly brings you off-policy RL training"):

- ``token-truncate`` / ``sequence-truncate``: w ← min(w, C)  (truncated IS)
- ``token-mask`` / ``sequence-mask``: w ← w · 1[1/C ≤ w ≤ C]  (masked IS: the token / sequence is dropped)
"""

from __future__ import annotations

import dataclasses

import torch

from .aggregation import masked_mean
from .batch import PolicyBatch

ROLLOUT_CORRECTIONS = ("none", "token-truncate", "token-mask", "sequence-truncate", "sequence-mask")
#: config field -> its "off" value; an objective that does not call ``prepare`` refuses any other value
BATCH_OPTIONS = {"mask_truncated": False, "rollout_correction": "none", "off_policy_mask_threshold": 0.0}
LOG_CLAMP = 20.0


def mismatch_metrics(batch: PolicyBatch, sampler: torch.Tensor) -> dict[str, torch.Tensor]:
    """KL(sampler ‖ trainer) per token (k3 on the sampled tokens, and k1), over completion tokens."""
    d = (batch.old_logprobs - sampler) * batch.mask  # log(π_old / π_sampler)
    return {"objective/mismatch_kl_k3": masked_mean(torch.exp(d) - d - 1.0, batch.mask),
            "objective/mismatch_kl_k1": masked_mean(-d, batch.mask)}


def is_weights(batch: PolicyBatch, mode: str, cap: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Rollout-correction weights, (B, T) for token modes or (B, 1) for sequence modes, and their metrics."""
    sampler = batch.require("sampler_logprobs", f"rollout_correction={mode}")
    mask = batch.mask
    d = (batch.old_logprobs - sampler) * mask
    if mode.startswith("sequence"):  # the summed log-ratio is clamped, never each token before the sum (as verl)
        d = d.sum(-1, keepdim=True)  # (B, 1)
    d = d.clamp(-LOG_CLAMP, LOG_CLAMP)  # only so that exp() stays finite
    raw = torch.exp(d)
    if mode.endswith("truncate"):
        w = raw.clamp(max=cap)
        cut = raw > cap
    else:
        cut = (raw > cap) | (raw < 1.0 / cap)
        w = raw.masked_fill(cut, 0.0)
    rows = mask if d.shape[1] > 1 else (mask.sum(-1, keepdim=True) > 0).to(mask.dtype)
    valid = rows > 0
    raw_valid = raw[valid]
    one = torch.ones(())
    metrics = {
        "objective/is_weight_mean": masked_mean(w.detach(), rows),
        "objective/is_weight_min": raw_valid.min() if raw_valid.numel() else one,
        "objective/is_weight_max": raw_valid.max() if raw_valid.numel() else one,
        "objective/is_cut_frac": masked_mean(cut.to(mask.dtype), rows),
    }
    return w.detach(), metrics


def off_policy_keep(batch: PolicyBatch, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556, eq. 9, as TRL): keep sequence i unless Â_i < 0
    and mean_t (s − sg[lp]) > δ, with s the sampler's log-probs (the old ones when the sampler gave none). (B, 1)."""
    s = batch.sampler_logprobs if batch.sampler_logprobs is not None else batch.old_logprobs
    kl = ((s - batch.logprobs.detach()) * batch.mask).sum(-1) / batch.mask.sum(-1).clamp(min=1.0)  # (B,)
    keep = ((batch.advantages >= 0) | (kl <= threshold)).to(batch.mask.dtype)[:, None]
    return keep, 1.0 - keep.mean()


def prepare(batch: PolicyBatch, config) -> tuple[PolicyBatch, torch.Tensor | None, torch.Tensor | None,
                                                  dict[str, torch.Tensor]]:
    """Apply the batch options of ``config`` (an ``ObjectiveConfig``).

    Returns (batch with truncated completions masked out, IS weights or None, off-policy keep mask or None, metrics).
    """
    metrics: dict[str, torch.Tensor] = {}
    if config.mask_truncated:
        trunc = batch.require("truncated", "mask_truncated=True")
        metrics["objective/truncated_masked_frac"] = trunc.to(batch.mask.dtype).mean()
        batch = dataclasses.replace(batch, mask=batch.mask * (~trunc).to(batch.mask.dtype)[:, None])
    if batch.sampler_logprobs is not None:
        metrics.update(mismatch_metrics(batch, batch.sampler_logprobs))
    weights = keep = None
    if config.rollout_correction != "none":
        weights, m = is_weights(batch, config.rollout_correction, config.rollout_correction_cap)
        metrics.update(m)
    if config.off_policy_mask_threshold > 0:
        keep, frac = off_policy_keep(batch, config.off_policy_mask_threshold)
        metrics["objective/off_policy_masked_frac"] = frac
    return batch, weights, keep, metrics
