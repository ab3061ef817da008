"""Skipping sequences with Â = 0 (``Objective.zero_advantage_terms``): for every registered objective and for the
config values that switch a term on, the gradient of the loss over the live sequences, weighted by their share of the
full batch's loss weight, equals the full computation's when the objective declares the skip, and differs when it
declares a term that reaches Â = 0 sequences (so declaring the skip wrongly fails here)."""

from __future__ import annotations

import pytest
import torch

from algorithms import PolicyBatch, get_objective, has_advantage, list_objectives

from .conftest import random_batch, with_groups

# registered objectives, plus config values that switch on a term reaching Â = 0 sequences or a batch option
CASES = [(name, {}) for name in list_objectives()] + [
    ("grpo", {"kl_coef": 0.0}),
    ("grpo", {"kl_coef": 0.0, "entropy_coef": 1e-3}),
    ("grpo", {"kl_coef": 0.0, "ratio_level": "sequence"}),
    ("grpo", {"kl_coef": 0.0, "rollout_correction": "token-mask"}),
    ("grpo", {"kl_coef": 0.0, "rollout_correction": "sequence-truncate"}),
    ("grpo", {"kl_coef": 0.0, "off_policy_mask_threshold": 0.05}),
    ("grpo", {"kl_coef": 0.0, "aggregation": "seq-mean-token-sum"}),
    ("dapo", {"mask_truncated": True}),
    ("dr_grpo", {"mask_truncated": True}),
    ("ppo_dual_clip", {"clip_delta": 3.0}),
    ("gspo", {"kl_coef": 0.04}),
    ("cispo", {"entropy_coef": 1e-2}),
    ("vespo", {"rollout_correction": "token-truncate"}),
    ("gmpo", {"rollout_correction": "token-truncate", "kl_coef": 0.0}),
    ("tepo", {"adv_threshold": -0.5}),
    ("tepo", {"kl_mask": "adv", "adv_threshold": 0.3}),
    ("tepo", {"kl_coef": 0.0, "kl_mask": "all"}),
    ("tepo-mask-all", {"kl_target": "old"}),
    ("ppo", {"kl_coef": 0.04}),
    ("ppo", {"entropy_coef": 1e-3}),
    ("tpo", {"kl_coef": 1e-3}),
]
IDS = [name + "".join(f"-{k}={v}" for k, v in ov.items()) for name, ov in CASES]


DEAD = [2, 3, 8, 9]


def zero_advantage_batch(seed: int, selective: bool = False) -> dict:
    """12 completions in 6 groups of 2; groups 1 and 4 have Â = 0 (all-equal rewards); float64; some completions
    truncated; sampler log-probs near the old ones. ``selective``: the Â = 0 sequences hold tokens that a covariance
    selection takes (mean Â > 0 and low log-probs there: cov = (lp − mean lp)(0 − mean Â) is large)."""
    t = random_batch(B=12, T=9, seed=seed, requires_grad=False)
    g = torch.Generator().manual_seed(100 + seed)
    t = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
    adv = t["advantages"].clone()
    if selective:
        adv = adv + 1.5
        lp = t["logprobs"].clone()
        lp[DEAD] = -4.0  # inside Clip-Cov's band (1, 5)
        lp[DEAD[0], 0] = -9.0  # KL-Cov's top token
        t["logprobs"] = lp
    adv[DEAD] = 0.0
    t["advantages"] = adv
    token_adv = t["token_advantages"].clone()  # (per-token advantages, PPO's: every token of a dead row has Â = 0)
    if selective:
        token_adv = token_adv + 1.5
    token_adv[DEAD] = 0.0
    t["token_advantages"] = token_adv
    t["sampler_logprobs"] = (t["old_logprobs"] + 0.2 * torch.randn(12, 9, generator=g, dtype=torch.float64)
                             ).clamp(max=-1e-3)
    t["truncated"] = torch.tensor([False, True, False, True, False, False, True, False, False, False, True, False])
    for k in ("logprobs", "entropy"):
        t[k] = t[k].clone().requires_grad_(True)
    return t


def gradients(obj, t: dict, skip: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """d loss / d (logprobs, entropy): the full batch's, or the live sequences' loss weighted by
    w(live) / w(all sequences) (what the training loop computes when it skips)."""
    gen = torch.Generator().manual_seed(0)
    t = with_groups(obj, t)  # (6 groups of 2; the Â = 0 rows are groups 1 and 4, whole)
    if not skip:
        loss, _ = obj.loss(PolicyBatch(**t), generator=gen)
    else:
        live = has_advantage(t["advantages"], t["token_advantages"] if obj.uses_token_advantages else None,
                             t["mask"])
        part = {k: (v[live] if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
        w_all = obj.loss_weight(t["mask"], t["truncated"])
        w_live = obj.loss_weight(part["mask"], part["truncated"])
        loss = obj.loss(PolicyBatch(**part), generator=gen)[0] * w_live / w_all
    g_lp, g_ent = torch.autograd.grad(loss, [t["logprobs"], t["entropy"]], allow_unused=True)
    return g_lp, torch.zeros_like(t["entropy"]) if g_ent is None else g_ent


@pytest.mark.parametrize(("name", "overrides"), CASES, ids=IDS)
def test_skipping_zero_advantage_sequences_is_exact_exactly_when_declared(name, overrides):
    obj = get_objective(name, **overrides)
    diffs = []
    for seed in range(5):
        t = zero_advantage_batch(seed, selective=seed == 4)
        full, skipped = gradients(obj, t, skip=False), gradients(obj, t, skip=True)
        assert full[0].abs().sum() > 0
        if obj.skips_zero_advantage:
            for a, b in zip(full, skipped):
                torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
        diffs.append(max(float((a - b).abs().max()) for a, b in zip(full, skipped)))
    if not obj.skips_zero_advantage:  # the declared term reaches the Â = 0 sequences on some batch (float64: an
        # exact skip differs by rounding, ~1e-16)
        assert max(diffs) > 1e-8, f"{name} {overrides}: declares {obj.zero_advantage_terms()} but skipping is exact"


def test_declarations_follow_the_config_values():
    assert get_objective("grpo").zero_advantage_terms()  # β = 0.04
    assert get_objective("grpo", kl_coef=0.0).skips_zero_advantage
    assert not get_objective("grpo", kl_coef=0.0, entropy_coef=1e-3).skips_zero_advantage
    assert get_objective("tepo").skips_zero_advantage  # KL mask on Â > τ_A = 0
    assert not get_objective("tepo", adv_threshold=-0.1).skips_zero_advantage
    assert not get_objective("tepo-mask-all").skips_zero_advantage
    assert get_objective("tepo-mask-all", kl_coef=0.0).skips_zero_advantage
    for name in ("clip_cov", "kl_cov", "forking_tokens"):
        assert not get_objective(name).skips_zero_advantage


def test_an_objective_that_does_not_declare_is_never_skipped():
    from algorithms import Objective

    class Plain(Objective):
        def loss(self, batch, generator=None):
            return (batch.logprobs * batch.mask).sum(), {}

    from algorithms import ObjectiveConfig

    assert not Plain(ObjectiveConfig()).skips_zero_advantage


@pytest.mark.parametrize("name", ["dapo", "dr_grpo", "grpo"])
def test_split_invariance_with_truncated_completions_masked(name):
    """mask_truncated: the micro-batch weights count only the tokens the loss's normaliser counts."""
    obj = get_objective(name, mask_truncated=True)
    t = zero_advantage_batch(5)
    loss, _ = obj.loss(PolicyBatch(**t))
    parts = []
    for sl in (slice(0, 5), slice(5, 12)):
        part = PolicyBatch(**{k: (v[sl] if isinstance(v, torch.Tensor) else v) for k, v in t.items()})
        parts.append((obj.loss(part)[0], obj.loss_weight(part.mask, part.truncated)))
    combined = sum(lo * w for lo, w in parts) / sum(w for _, w in parts)
    torch.testing.assert_close(combined, loss)
