"""verl 0.9.1's advantage estimator ``gdpo`` and policy loss ``bypass_mode`` against pobench on the same CPU tensors.

- ``gdpo``: verl's ``compute_gdpo_outcome_advantage`` reads each reward component from ``non_tensor_batch`` under the
  keys ``algorithm.gdpo_reward_keys`` names (weights ``gdpo_reward_weights``), puts it on the completion's last token,
  z-scores it within its prompt group, sums with the weights and whitens over the tokens; ours is
  ``group_advantages(..., "gdpo", reward_components=...)`` with the components in ``REWARD_COMPONENTS`` order.
- ``bypass_mode``: verl's trainer hands the loss the rollout engine's log-probs as ``old_log_prob``. pobench's batch
  with ``old_logprobs`` = the sampler's log-probs (what the native loop does with an exact sampler) then gives the same
  loss and gradient: ``loss_type=ppo_clip`` is verl's ``vanilla`` on them, whatever ``rollout_is`` says (verl computes
  the IS weights for metrics only), i.e. ``ppo_dual_clip``; ``loss_type=reinforce`` without IS is −Â·lp, i.e. ``gpg``'s
  term; with token-level truncated IS (TIS, threshold C) it is −sg[min(π_θ/π_rollout, C)]·Â·lp, i.e. ``cispo`` with
  ε_low = 1, ε_high = C − 1; with any of its IS settings (token / sequence, TIS / IcePop) it is ``reinforce_is``.
  verl's rejection sampling (``rollout_rs``) has no pobench counterpart (docs/objectives.md).

Runs in `tox -e verl`; skipped where verl is absent.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (tox -e verl)")

from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

from algorithms import get_objective, group_advantages  # noqa: E402
from algorithms.advantages import REWARD_COMPONENTS  # noqa: E402
from tests.verl import test_verl_parity as parity  # noqa: E402

pytestmark = pytest.mark.verl

# ------------------------------------------------------------------------------------------------ gdpo
P, G, T = 4, 4, 7
LENGTHS = torch.tensor([[3, 7, 5, 2], [6, 1, 4, 7], [2, 2, 7, 5], [4, 3, 6, 1]])
#: verl-style keys for our components (verl reads whatever keys the reward function returns)
KEYS = {"correct": "acc", "format": "format_reward", "overlong": "overlong_reward"}


def components(seed: int = 0) -> torch.Tensor:
    """(P, G, 3): binary outcome and format, an overlong penalty in [−1, 0] on some completions; group 1 all right."""
    g = torch.Generator().manual_seed(seed)
    correct = torch.rand(P, G, generator=g).round()
    correct[1] = 1.0
    fmt = torch.maximum(correct, torch.rand(P, G, generator=g).round())
    overlong = -(torch.rand(P, G, generator=g) * (LENGTHS >= 6)).round(decimals=2)
    out = {"correct": correct, "format": fmt, "overlong": overlong}
    return torch.stack([out[c] for c in REWARD_COMPONENTS], -1).double()


def verl_gdpo(comps: torch.Tensor, lengths: torch.Tensor, weights=None) -> torch.Tensor:
    """verl's gdpo on the flattened (P·G, T) batch, as ray_trainer.compute_advantage calls it."""
    p, g = lengths.shape
    n = p * g
    prompt_len = 2
    mask = (torch.arange(T)[None, :] < lengths.flatten()[:, None]).double()
    attention = torch.cat([torch.ones(n, prompt_len), mask], dim=1).long()
    non_tensor = {KEYS[c]: comps[..., k].flatten().numpy() for k, c in enumerate(REWARD_COMPONENTS)}
    token_rewards = torch.zeros(n, T, dtype=torch.float64)
    token_rewards[torch.arange(n), lengths.flatten() - 1] = (comps[..., 0] + comps[..., 2]).flatten()
    config = AlgoConfig(adv_estimator="gdpo", gdpo_reward_keys=[KEYS[c] for c in REWARD_COMPONENTS],
                        gdpo_reward_weights=None if weights is None else list(weights))
    fn = core_algos.get_adv_estimator_fn("gdpo")
    adv, _ = fn(token_level_rewards=token_rewards, response_mask=mask, index=np.repeat(np.arange(p), g),
                config=config, non_tensor_batch=non_tensor,
                batch={"prompts": torch.zeros(n, prompt_len), "attention_mask": attention})
    return adv, mask


@pytest.mark.parametrize("weights", [None, (1.0, 0.5, 2.0), (1.0, 0.0, 0.0)])
@pytest.mark.parametrize("seed", [0, 1])
def test_gdpo_matches_verl(seed, weights):
    comps = components(seed)
    their, mask = verl_gdpo(comps, LENGTHS, weights)
    ours = group_advantages(comps[..., 0] + comps[..., 2], "gdpo", lengths=LENGTHS, reward_components=comps,
                            component_weights=weights)
    # verl's components are float32 and its masked means divide by count + 1e-8
    torch.testing.assert_close(ours.flatten()[:, None] * mask, their.double(), rtol=1e-5, atol=1e-5)


def test_gdpo_objective_matches_verl():
    comps = components(2)
    obj = get_objective("gdpo", gdpo_weight_format=0.3, gdpo_weight_overlong=0.7)
    their, mask = verl_gdpo(comps, LENGTHS, obj.config.gdpo_weights)
    ours = obj.advantages(comps[..., 0] + comps[..., 2], lengths=LENGTHS, reward_components=comps)
    torch.testing.assert_close(ours.flatten()[:, None] * mask, their.double(), rtol=1e-5, atol=1e-5)


def test_gdpo_groups_of_one_match_verl():
    """verl gives a group of one mean 0 and std 1 (r/(1 + 1e-6) per component): so do we."""
    comps = components(3)[:, :1]
    lengths = LENGTHS[:, :1]
    their, mask = verl_gdpo(comps, lengths)
    ours = group_advantages(comps[..., 0] + comps[..., 2], "gdpo", lengths=lengths, reward_components=comps)
    torch.testing.assert_close(ours.flatten()[:, None] * mask, their.double(), rtol=1e-5, atol=1e-5)
    assert their.abs().max() > 0.1


# ------------------------------------------------------------------------------------------------ bypass_mode
B = 8


def tensors(seed: int = 0, noise: float = 0.4):
    """Current log-probs lp and the ROLLOUT engine's log-probs (verl's old_log_prob in bypass mode)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 5, 7, 1, 6, 4, 2])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    rollout = (lp + noise * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return lp, rollout, adv, mask


def verl_bypass(lp, rollout, adv, mask, agg, loss_type, clip_ratio_c=3.0, **correction):
    lp = lp.clone().requires_grad_(True)
    policy_loss = PolicyLossConfig(loss_mode="bypass_mode",
                                   rollout_correction={"loss_type": loss_type, **correction})
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.2,
                         clip_ratio_high=0.28, clip_ratio_c=clip_ratio_c, policy_loss=policy_loss)
    loss, _ = core_algos.get_policy_loss_fn("bypass_mode")(
        old_log_prob=rollout, log_prob=lp, advantages=adv[:, None] * mask, response_mask=mask, loss_agg_mode=agg,
        config=config)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


def pobench(name, lp, rollout, adv, mask, **overrides):
    """pobench's loss where π_old is the sampler: old_logprobs = sampler_logprobs = the rollout engine's (the parity
    tests' own helper, test_verl_parity.ours, whose T is this file's)."""
    assert parity.T == T
    return parity.ours(name, lp, rollout, adv, mask, sampler=rollout, **overrides)


#: verl's rollout_correction IS settings -> pobench's rollout_correction with the same cap (identity here: w =
#: exp(old − sampler) = 1 when old is the sampler, as verl's ppo_clip ignores its IS weights)
IS_SETTINGS = {
    "no-is": ({}, {}),
    "token-tis": ({"rollout_is": "token", "rollout_is_threshold": 2.0},
                  {"rollout_correction": "token-truncate", "rollout_correction_cap": 2.0}),
    "sequence-tis": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0},
                     {"rollout_correction": "sequence-truncate", "rollout_correction_cap": 2.0}),
    "token-icepop": ({"rollout_is": "token", "rollout_is_threshold": "0.5_2.0"},
                     {"rollout_correction": "token-mask", "rollout_correction_cap": 2.0}),
}


@pytest.mark.parametrize("noise", [0.4, 1.0])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("setting", list(IS_SETTINGS))
def test_bypass_ppo_clip_is_the_clipped_surrogate_on_the_sampler_logprobs(setting, agg, noise):
    theirs_kw, ours_kw = IS_SETTINGS[setting]
    lp, rollout, adv, mask = tensors(seed=1, noise=noise)
    their = verl_bypass(lp, rollout, adv, mask, agg, "ppo_clip", **theirs_kw)
    ours = pobench("ppo_dual_clip", lp, rollout, adv, mask, clip_high=0.28, aggregation=agg, **ours_kw)
    for a, b in zip(ours, their):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_bypass_reinforce_without_is_is_the_reinforce_term(agg):
    lp, rollout, adv, mask = tensors(seed=2)
    their = verl_bypass(lp, rollout, adv, mask, agg, "reinforce")
    ours = pobench("gpg", lp, rollout, adv, mask, aggregation=agg)
    for a, b in zip(ours, their):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cap", [1.5, 2.0, 5.0])
@pytest.mark.parametrize("noise", [0.4, 1.0])
def test_bypass_reinforce_with_token_tis_is_cispo_without_a_lower_clip(cap, noise):
    """verl: −sg[min(π_θ/π_rollout, C)]·Â·lp; CISPO: −sg[clip(r, 1 − ε_low, 1 + ε_high)]·Â·lp with r = π_θ/π_old:
    the same with π_old = π_rollout, ε_low = 1 (r > 0 always) and ε_high = C − 1."""
    lp, rollout, adv, mask = tensors(seed=3, noise=noise)
    their = verl_bypass(lp, rollout, adv, mask, "token-mean", "reinforce", rollout_is="token",
                        rollout_is_threshold=cap)
    ours = pobench("cispo", lp, rollout, adv, mask, clip_low=1.0, clip_high=cap - 1.0)
    for a, b in zip(ours, their):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    if cap < 5.0:  # the cap binds on some tokens here, so this is not the uncapped REINFORCE term
        assert ((lp - rollout).exp() * mask > cap).any()


#: verl's rollout_correction IS settings for loss_type=reinforce -> reinforce_is overrides (verl's presets:
#: bypass_pg_is = sequence TIS at 2, bypass_pg_token_icepop = token IcePop [0.5, 5])
REINFORCE_IS = {
    "none": ({}, {"is_level": "none"}),
    "sequence-tis": ({"rollout_is": "sequence", "rollout_is_threshold": 2.0}, {}),
    "token-tis": ({"rollout_is": "token", "rollout_is_threshold": 1.5}, {"is_level": "token", "is_cap": 1.5}),
    "token-icepop": ({"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
                     {"is_level": "token", "is_mode": "mask", "is_cap": 5.0}),
    "token-icepop-narrow": ({"rollout_is": "token", "rollout_is_threshold": "0.8_1.25"},
                            {"is_level": "token", "is_mode": "mask", "is_cap": 1.25, "is_floor": 0.8}),
    "sequence-icepop": ({"rollout_is": "sequence", "rollout_is_threshold": "0.2_5.0"},
                        {"is_level": "sequence", "is_mode": "mask", "is_cap": 5.0, "is_floor": 0.2}),
}


@pytest.mark.parametrize("noise", [0.4, 1.0])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("setting", list(REINFORCE_IS))
def test_bypass_reinforce_is_reinforce_is(setting, agg, noise):
    theirs_kw, ours_kw = REINFORCE_IS[setting]
    lp, rollout, adv, mask = tensors(seed=4, noise=noise)
    their = verl_bypass(lp, rollout, adv, mask, agg, "reinforce", **theirs_kw)
    ours = pobench("reinforce_is", lp, rollout, adv, mask, aggregation=agg, **ours_kw)
    for a, b in zip(ours, their):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_the_weights_bind_on_these_tensors():
    """So the parity above is not that of weights all 1 or all kept: far off-policy, sequence weights exceed 2 and
    fall below 0.2, token weights leave [0.8, 1.25] on both sides."""
    lp, rollout, _, mask = tensors(seed=4, noise=1.0)
    seq = ((lp - rollout) * mask).sum(-1).exp()
    tok = (lp - rollout).exp()[mask > 0]
    assert (seq > 5).any() and (seq < 0.2).any() and (tok > 1.25).any() and (tok < 0.8).any()


def test_bypass_reinforce_with_sequence_is_is_not_cispo_at_sequence_level():
    """CISPO's sequence ratio is the geometric MEAN of the token ratios, not their product: not verl's sequence IS."""
    lp, rollout, adv, mask = tensors(seed=3)
    their = verl_bypass(lp, rollout, adv, mask, "token-mean", "reinforce", rollout_is="sequence",
                        rollout_is_threshold=2.0)
    ours = pobench("cispo", lp, rollout, adv, mask, clip_low=1.0, clip_high=1.0, ratio_level="sequence")
    assert not torch.allclose(ours[1], their[1], atol=1e-4)
