"""Micro-batches with little padding: each minibatch is split into micro-batches of similar sequence lengths.

Every micro-batch is laid out as left-padded prompts + right-padded completions (bench/rollout/scoring.py), so a
micro-batch costs its size x (longest prompt + longest completion) tokens of forward / backward work whatever the real
lengths.
Grouping sequences of similar length (after the random minibatch draw) removes most of that padding. For objectives
whose loss is split-invariant (``Objective.split_invariant``: the loss-weighted micro-batch losses add up to the
minibatch loss) the gradient is the same as with any other split; objectives that select tokens per micro-batch keep
the random split.
"""

from __future__ import annotations

import torch


def length_grouped(indices: torch.Tensor, completion_lengths: list[int], prompt_lengths: list[int], size: int
                   ) -> tuple[torch.Tensor, ...]:
    """Split `indices` into micro-batches of at most `size`, as many as ``torch.split`` makes, grouped by length
    (completion length, then prompt length; ties keep the input order)."""
    order = sorted(range(len(indices)), key=lambda j: (completion_lengths[int(indices[j])],
                                                       prompt_lengths[int(indices[j])]))
    return torch.split(indices[torch.tensor(order, dtype=torch.long)], size)


def padded_tokens(micro: tuple[torch.Tensor, ...], completion_lengths: list[int], prompt_lengths: list[int]) -> int:
    """Token positions the scoring pass computes for these micro-batches (real and padding)."""
    return sum(len(idx) * (max(prompt_lengths[int(i)] for i in idx) + max(completion_lengths[int(i)] for i in idx))
               for idx in micro)
