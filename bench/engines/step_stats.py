"""The per-step training statistics, computed once for every engine that runs pobench's update (the native loop and
the TRL trainer; verl's own are renamed onto the same keys: bench/engines/verl/launch.py ``METRIC_MAP``):

- ``rollout_summary``: the ``rollout/*`` metrics of a step's first sampling round (rewards, verifier accuracy, groups
  without signal, lengths, truncation);
- ``entropy_summary``: ``rollout/entropy_*`` of the sampling distribution's per-token entropies;
- ``UpdateStats``: what the update's micro-batches add up to: the objective's metrics and ``train/loss`` weighted as
  the gradient accumulation weighs them (``Objective.loss_weight``), ``train/kl_ref``, how far the policy moved from
  the sampling policy (``train/abs_log_ratio*``) and ``train/grad_norm``;
- ``throughput``: ``perf/*``, verl's throughput definition;
- ``machine_load``: ``sys/load_avg_1m``, the load the machine was under (what a wall-clock number is read against).

Names: reports/metric_keys.py; meanings: docs/METRICS.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from algorithms import PolicyBatch, kl_estimate
from algorithms.aggregation import masked_mean
from reports import metric_keys as K

# drift sums kept next to the weighted metric sums (so a distributed engine reduces them all in one go)
_ABS, _TOKENS, _SEQ, _SEQS = "#abs", "#tokens", "#seq", "#seqs"


def percentiles(values: torch.Tensor, qs=(10, 50, 90)) -> dict[int, float]:
    if values.numel() == 0:
        return {q: float("nan") for q in qs}
    v = torch.quantile(values.float(), torch.tensor([q / 100 for q in qs]))
    return {q: float(x) for q, x in zip(qs, v)}


def rollout_summary(shaped: torch.Tensor, correct: torch.Tensor, lengths: torch.Tensor, truncated: torch.Tensor
                    ) -> dict[str, float]:
    """``rollout/*`` of one sampling round: ``shaped`` (P, G) rewards the objective trains on, ``correct`` (P·G,)
    verifier outcomes, ``lengths`` (P·G,) completion lengths, ``truncated`` (P·G,) finished by length."""
    P = shaped.shape[0]
    return {
        K.REWARD_MEAN: float(shaped.mean()), K.REWARD_STD: float(shaped.std()),
        K.ROLLOUT_ACCURACY: float(correct.mean()),
        K.ZERO_ADV_FRAC: int(((shaped.max(1).values - shaped.min(1).values) == 0).sum()) / P,
        K.LENGTH_MEAN: float(lengths.float().mean()), K.LENGTH_MAX: float(lengths.max()),
        K.TRUNCATION_RATE: float(truncated.sum()) / truncated.numel(),
    }


def entropy_summary(entropies: torch.Tensor) -> dict[str, float]:
    """``rollout/entropy_*`` of the per-token entropies of a step's completions (NaN when there are none)."""
    pct = percentiles(entropies)
    return {K.ENTROPY_MEAN: float(entropies.mean()) if entropies.numel() else float("nan"),
            K.ENTROPY_P10: pct[10], K.ENTROPY_P50: pct[50], K.ENTROPY_P90: pct[90]}


def throughput(tokens: float, step_s: float, devices: int) -> dict[str, float]:
    """verl's throughput definition (``compute_throughout_metrics``): ``tokens`` (prompt + completion tokens of the
    step's training batch, every device's) / (step seconds x devices)."""
    return {K.TOTAL_NUM_TOKENS: float(tokens), K.THROUGHPUT: tokens / (max(step_s, 1e-9) * devices)}


@dataclass
class UpdateStats:
    """The statistics of one step's update, accumulated micro-batch by micro-batch (``add``), optimizer step by
    optimizer step (``add_grad_norm``); ``summary`` gives the step's metrics. ``sums`` / ``weight`` / ``drift_max``
    are plain numbers, so an engine on several processes adds up (max for ``drift_max``) its processes' values before
    the summary."""

    sums: dict[str, float] = field(default_factory=dict)
    weight: float = 0.0
    drift_max: float = 0.0
    grad_norms: list[float] = field(default_factory=list)

    def add(self, batch: PolicyBatch, loss: torch.Tensor, metrics: dict[str, torch.Tensor], weight: float) -> None:
        """One micro-batch: the objective's ``(loss, metrics)`` on ``batch``, weighted by its ``loss_weight``."""
        m = dict(metrics)
        mask = batch.mask
        lp = batch.logprobs.detach()
        if batch.ref_logprobs is not None:
            m[K.KL_REF] = masked_mean(kl_estimate(lp, batch.ref_logprobs, "k3"), mask)
        m[K.LOSS] = loss.detach()
        log_r = (lp - batch.old_logprobs) * mask  # (B, T)
        for key, v in m.items():
            self.sums[key] = self.sums.get(key, 0.0) + float(v) * weight
        self.weight += weight
        self.sums[_ABS] = self.sums.get(_ABS, 0.0) + float(log_r.abs().sum())
        self.sums[_TOKENS] = self.sums.get(_TOKENS, 0.0) + float(mask.sum())
        self.sums[_SEQ] = self.sums.get(_SEQ, 0.0) + float((log_r.sum(-1) / mask.sum(-1).clamp(min=1.0)).abs().sum())
        self.sums[_SEQS] = self.sums.get(_SEQS, 0.0) + float(mask.shape[0])
        if log_r.numel():
            self.drift_max = max(self.drift_max, float(log_r.abs().max()))

    def add_grad_norm(self, norm: float) -> None:
        self.grad_norms.append(norm)

    def summary(self) -> dict[str, float]:
        """The step's ``objective/*`` and ``train/*`` metrics (``train/lr`` aside: the scheduler's)."""
        s = self.sums
        out = {k: v / max(self.weight, 1e-30) for k, v in s.items() if not k.startswith("#")}
        out[K.GRAD_NORM] = sum(self.grad_norms) / len(self.grad_norms) if self.grad_norms else math.nan
        out[K.ABS_LOG_RATIO] = s.get(_ABS, 0.0) / max(s.get(_TOKENS, 0.0), 1.0)
        out[K.ABS_LOG_RATIO_MAX] = self.drift_max
        out[K.ABS_SEQ_LOG_RATIO] = s.get(_SEQ, 0.0) / max(s.get(_SEQS, 0.0), 1.0)
        return out


def machine_load() -> dict[str, float]:
    """``sys/load_avg_1m``: the machine's 1-minute load average now (processes running or waiting for a core, this
    run's included; read it against the machine's core count); nothing where the system has none (Unix only)."""
    try:
        return {K.LOAD_AVG_1M: float(os.getloadavg()[0])}
    except (AttributeError, OSError):
        return {}
