"""Micro-batches with little padding: each minibatch is split into micro-batches of similar sequence lengths.

Every micro-batch is laid out as left-padded prompts + right-padded completions (bench/rollout/scoring.py), so a
micro-batch costs its size x (longest prompt + longest completion) tokens of forward / backward work whatever the real
lengths.
Grouping sequences of similar length (after the random minibatch draw) removes most of that padding. For objectives
whose loss is split-invariant (``Objective.split_invariant``: the loss-weighted micro-batch losses add up to the
minibatch loss) the gradient is the same as with any other split; objectives that select tokens per micro-batch keep
the random split.

An objective whose loss couples the completions of a group (``Objective.needs_whole_groups``: TPO) gets whole groups
instead: the minibatch draw permutes groups, and each micro-batch holds max(1, ⌊micro_batch_size / G⌋) whole groups,
each contiguous, in group order (a micro_batch_size that is not a multiple of G is rounded down to whole groups, and
up to one group when it is smaller than G).
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


def group_size_of(groups) -> int:
    """G, the one size of the rollout's groups (``Group.completion_ids``); ValueError when they differ."""
    sizes = {len(g.completion_ids) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"micro-batches of whole groups need groups of one size, got sizes {sorted(sizes)}")
    return sizes.pop()


def whole_group_minibatches(order: torch.Tensor, n_rows: int, group_size: int, minibatches: int
                            ) -> tuple[torch.Tensor, ...]:
    """Rows (prompt-major: group k is rows k·G .. k·G + G − 1) split into ``minibatches`` minibatches of whole groups:
    the groups in the order of their first row in the permutation ``order``, split as ``torch.tensor_split`` splits,
    each minibatch's groups then sorted, each group's rows contiguous and in their order."""
    n_groups = n_rows // group_size
    firsts = [int(i) // group_size for i in order if int(i) % group_size == 0]  # a permutation of the groups
    out = []
    for part in torch.tensor_split(torch.tensor(firsts, dtype=torch.long), min(minibatches, n_groups)):
        ids = part.sort().values
        out.append((ids[:, None] * group_size + torch.arange(group_size)[None, :]).reshape(-1))
    return tuple(out)


def whole_group_micro_batches(rows: torch.Tensor, group_size: int, size: int) -> tuple[torch.Tensor, ...]:
    """``rows`` (whole groups, contiguous) split into micro-batches of max(1, ⌊size / G⌋) whole groups, in order."""
    if not len(rows):
        return ()
    return torch.split(rows, max(1, size // group_size) * group_size)
