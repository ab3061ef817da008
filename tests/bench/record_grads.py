"""An optimizer for gradient comparisons: it keeps each step's gradients and leaves the parameters alone, so two
updates of one model (with and without a saving, two micro-batch splits) start from the same weights."""

from __future__ import annotations

import torch


class RecordGrads(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {})
        self.grads: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.grads.append([p.grad.clone() for group in self.param_groups for p in group["params"]])
