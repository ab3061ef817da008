"""The batch every objective consumes: per-token tensors of one (micro-)batch of completions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .base import Objective


@dataclass
class PolicyBatch:
    """Per-token quantities of B completions padded to T tokens (completion positions only).

    ``logprobs`` (and ``entropy`` when given) come from the current policy and carry gradient; everything else is
    treated as a constant by every objective.
    """

    logprobs: torch.Tensor  # (B, T) log π_θ(y_t | ·), with gradient
    old_logprobs: torch.Tensor  # (B, T) log π_old, the policy that sampled the rollout
    advantages: torch.Tensor  # (B,) Â_i, one value per completion
    mask: torch.Tensor  # (B, T) 1 for completion tokens, 0 for padding
    max_length: int  # L_max: the configured maximum completion length (Dr. GRPO's constant)
    ref_logprobs: torch.Tensor | None = None  # (B, T) log π_ref (frozen initial policy)
    entropy: torch.Tensor | None = None  # (B, T) H_θ at each position, current policy (may carry gradient)
    old_entropy: torch.Tensor | None = None  # (B, T) H_old
    ref_entropy: torch.Tensor | None = None  # (B, T) H_ref
    sampler_logprobs: torch.Tensor | None = None  # (B, T) log-probs the rollout engine reported (rollout correction)
    truncated: torch.Tensor | None = None  # (B,) bool: the completion hit L_max without a stop token
    #: (B, T) Â_it, one advantage per token (an objective that declares it, ``Objective.uses_token_advantages``, reads
    #: it in place of ``advantages`` broadcast over the tokens: PPO's GAE from a critic)
    token_advantages: torch.Tensor | None = None
    #: G: the rows are whole groups of G completions of one prompt, contiguous and in group order (an objective that
    #: declares ``Objective.needs_whole_groups`` reads it; None: no group structure is given)
    group_size: int | None = None

    def __post_init__(self) -> None:
        B, T = self.logprobs.shape
        if self.advantages.shape != (B,):
            raise ValueError(f"PolicyBatch.advantages must have shape ({B},), got {tuple(self.advantages.shape)}")
        for name in ("old_logprobs", "mask", "ref_logprobs", "entropy", "old_entropy", "ref_entropy",
                     "sampler_logprobs", "token_advantages"):
            t = getattr(self, name)
            if t is not None and t.shape != (B, T):
                raise ValueError(f"PolicyBatch.{name} must have shape ({B}, {T}), got {tuple(t.shape)}")
        if self.truncated is not None:
            if self.truncated.shape != (B,):
                raise ValueError(f"PolicyBatch.truncated must have shape ({B},), got {tuple(self.truncated.shape)}")
            self.truncated = self.truncated.to(torch.bool)
        if self.group_size is not None and (self.group_size < 1 or B % self.group_size):
            raise ValueError(f"PolicyBatch.group_size={self.group_size!r}: {B} rows are not whole groups of that size")
        if self.max_length < 1:
            raise ValueError(f"PolicyBatch.max_length must be >= 1, got {self.max_length}")
        self.mask = self.mask.to(self.logprobs.dtype)
        # constants by definition: no objective can leak gradient into them
        for name in ("old_logprobs", "advantages", "ref_logprobs", "old_entropy", "ref_entropy", "sampler_logprobs",
                     "token_advantages"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.detach())

    def require(self, name: str, who: str) -> torch.Tensor:
        """Return the named tensor, or raise naming the objective that needs it."""
        t = getattr(self, name)
        if t is None:
            raise ValueError(f"objective {who!r} needs PolicyBatch.{name}, which is None")
        return t

    @property
    def lengths(self) -> torch.Tensor:  # (B,) |y_i|
        return self.mask.sum(-1)


def has_advantage(advantages: torch.Tensor, token_advantages: torch.Tensor | None = None,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) bool: the completions with a nonzero advantage, the ones a zero-advantage skip keeps
    (``Objective.skips_zero_advantage``): Â_i != 0, or with per-token advantages Â_it != 0 on some completion token
    (a completion is skippable only when every one of its tokens has Â_it = 0)."""
    if token_advantages is None:
        return advantages != 0
    live = token_advantages != 0
    if mask is not None:
        live = live & (mask > 0)
    return live.any(-1)


def batch_for(objective: Objective, engine: str, *, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
              advantages: torch.Tensor, mask: torch.Tensor, max_length: int, group_size: int | None = None,
              **optional: torch.Tensor | None) -> PolicyBatch:
    """The one way an engine builds an objective's batch from its own tensors: the optional fields it has (``None``
    for those it has not), H_θ carrying gradient only when the objective's entropy bonus needs it, and every field the
    objective declares (``Objective.batch_fields``) present, else ValueError naming the objective, the field and
    ``engine`` (which did not compute it) before the loss runs."""
    missing = sorted(f for f in objective.batch_fields if optional.get(f) is None)
    if missing:
        raise ValueError(f"objective {objective.name!r} needs PolicyBatch.{', '.join(missing)}, which the {engine} did "
                         "not compute")
    if objective.needs_whole_groups and group_size is None:
        raise ValueError(f"objective {objective.name!r} needs PolicyBatch.group_size (micro-batches of whole groups), "
                         f"which the {engine} did not give")
    entropy = optional.get("entropy")
    if entropy is not None and not objective.needs_entropy_grad:
        optional["entropy"] = entropy.detach()
    return PolicyBatch(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask,
                       max_length=max_length, group_size=group_size, **optional)
