"""Random PolicyBatch factory shared by the objective tests."""

from __future__ import annotations

import pytest
import torch

from algorithms import PolicyBatch
from bench.plugins import load_plugins, plugins_from_env

# $POBENCH_PLUGINS (a JSON list of modules / .py files): their objectives join every test over the registered names,
# e.g. the contract (test_contract.py): docs/PLUGINS.md
load_plugins(plugins_from_env())


def random_batch(B: int = 6, T: int = 7, seed: int = 0, max_length: int = 10, *, on_policy: bool = False,
                 requires_grad: bool = True) -> dict[str, torch.Tensor]:
    """Raw tensors of a random batch (lengths 1..T, right padding)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    lp = -torch.rand(B, T, generator=g) * 3 - 0.05
    old = lp.clone() if on_policy else lp + 0.3 * torch.randn(B, T, generator=g)
    old = old.clamp(max=-1e-3)
    ref = (lp + 0.3 * torch.randn(B, T, generator=g)).clamp(max=-1e-3)
    ent = torch.rand(B, T, generator=g) * 2
    old_ent = ent + 0.3 * torch.randn(B, T, generator=g)
    ref_ent = ent + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    token_adv = torch.randn(B, T, generator=g)  # (per-token advantages: read only by objectives that declare them)
    t = dict(logprobs=lp, old_logprobs=old, ref_logprobs=ref, entropy=ent, old_entropy=old_ent, ref_entropy=ref_ent,
             advantages=adv, mask=mask, token_advantages=token_adv)
    if requires_grad:
        t = {k: v.clone().requires_grad_(True) if k != "mask" else v for k, v in t.items()}
    t["max_length"] = max_length
    return t


def as_batch(t: dict) -> PolicyBatch:
    return PolicyBatch(**t)


#: the group size the shared tests give an objective whose loss couples a group (``Objective.needs_whole_groups``:
#: TPO); every batch size they use is a multiple of it, and the random rows are in whole groups by construction
TEST_GROUP_SIZE = 2


def with_groups(obj, t: dict) -> dict:
    """``t`` with ``group_size`` for an objective that needs whole groups; unchanged for every other objective."""
    return {**t, "group_size": TEST_GROUP_SIZE} if obj.needs_whole_groups else t


@pytest.fixture
def make_batch():
    return random_batch
