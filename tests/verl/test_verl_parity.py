"""Our objectives, advantage estimators and rollout correction agree with verl 0.9.1's own functions (CPU tensors).

Runs in `tox -e verl` (verl pins transformers < 5.11, so it has its own environment); skipped where verl is absent.
Same tensors in, values and gradients w.r.t. the current log-probs must match.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (tox -e verl)")

from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

from algorithms import PolicyBatch, get_objective, group_advantages  # noqa: E402

pytestmark = pytest.mark.verl
B, T = 8, 7


def tensors(seed: int = 0, noise: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 5, 7, 1, 6, 4, 2])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    old = (lp + noise * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)  # log-probs
    sampler = old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return lp, old, sampler, adv, mask


def actor_config(**kw) -> ActorConfig:
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **kw)


def ours(name, lp, old, adv, mask, sampler=None, **overrides):
    lp = lp.clone().requires_grad_(True)
    batch = PolicyBatch(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, max_length=T,
                        sampler_logprobs=sampler)
    loss, _ = get_objective(name, **overrides).loss(batch)
    (g,) = torch.autograd.grad(loss, lp)
    return loss.detach(), g


def theirs(fn_name, lp, old, adv, mask, agg, config, weights=None):
    lp = lp.clone().requires_grad_(True)
    fn = core_algos.get_policy_loss_fn(fn_name)
    loss, _ = fn(old_log_prob=old, log_prob=lp, advantages=adv[:, None] * mask, response_mask=mask,
                 loss_agg_mode=agg, config=config, rollout_is_weights=weights)
    (g,) = torch.autograd.grad(loss, lp)
    return loss.detach(), g


LOSSES = {  # case -> (verl policy loss, verl agg mode, verl ActorConfig kwargs, our name, our overrides)
    "vanilla-dual-clip": ("vanilla", "token-mean", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                                                    "clip_ratio_c": 3.0},
                          "ppo_dual_clip", {"clip_high": 0.28}),
    "vanilla-seq-mean": ("vanilla", "seq-mean-token-mean", {"clip_ratio": 0.2, "clip_ratio_c": 2.0},
                         "grpo", {"kl_coef": 0.0, "dual_clip_c": 2.0}),
    "vanilla-seq-sum-norm": ("vanilla", "seq-mean-token-sum-norm", {"clip_ratio": 0.2, "clip_ratio_c": 3.0},
                             "dr_grpo", {"dual_clip_c": 3.0}),
    "gspo": ("gspo", "seq-mean-token-mean", {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}, "gspo", {}),
    "sapo": ("sapo", "seq-mean-token-mean", {"tau_pos": 1.0, "tau_neg": 1.05}, "sapo", {}),
    "gpg": ("gpg", "token-mean", {}, "gpg", {}),
    "geo_mean": ("geo_mean", "token-mean", {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4}, "gmpo", {}),
    "cispo": ("cispo", "token-mean", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, "cispo",
              {"clip_low": 0.2, "clip_high": 0.28}),
    # DPPO: verl's clip_ratio_low / _high are the divergence thresholds δ, clip_ratio_c the truncation C
    "dppo_tv": ("dppo_tv", "token-mean", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 20.0},
                "dppo_tv", {}),
    "dppo_tv-asymmetric-cap": ("dppo_tv", "seq-mean-token-mean", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.1,
                                                                  "clip_ratio_c": 1.5},
                               "dppo_tv", {"delta_low": 0.05, "delta_high": 0.1, "ratio_cap": 1.5,
                                           "aggregation": "seq-mean-token-mean"}),
    "dppo_kl": ("dppo_kl", "token-mean", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "clip_ratio_c": 20.0},
                "dppo_kl", {}),
    "dppo_kl-asymmetric-cap": ("dppo_kl", "token-mean", {"clip_ratio_low": 0.01, "clip_ratio_high": 0.03,
                                                         "clip_ratio_c": 2.0},
                               "dppo_kl", {"delta_low": 0.01, "delta_high": 0.03, "ratio_cap": 2.0}),
    "dro": ("dro", "token-mean", {"policy_loss": PolicyLossConfig(loss_mode="dro", dro_beta=0.05)}, "dro", {}),
    "dro-seq-sum": ("dro", "seq-mean-token-sum", {"policy_loss": PolicyLossConfig(loss_mode="dro", dro_beta=0.3)},
                    "dro", {"beta": 0.3, "aggregation": "seq-mean-token-sum"}),
}


#: tensor sets: the default, and one far off-policy (seed 2, noise 1) where DPPO's trust region drops tokens of both
#: advantage signs and its cap truncates ratios (at the default noise only tokens with Â < 0 leave it)
TENSOR_SETS = {"near": {}, "far": {"seed": 2, "noise": 1.0}}


@pytest.mark.parametrize("tensor_set", list(TENSOR_SETS))
@pytest.mark.parametrize("case", list(LOSSES))
def test_policy_loss_matches_verl(case, tensor_set):
    verl_name, agg, kw, name, overrides = LOSSES[case]
    lp, old, _, adv, mask = tensors(**TENSOR_SETS[tensor_set])
    their_loss, their_grad = theirs(verl_name, lp, old, adv, mask, agg, actor_config(**kw))
    our_loss, our_grad = ours(name, lp, old, adv, mask, **overrides)
    torch.testing.assert_close(our_loss, their_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode,level,threshold", [
    ("token-truncate", "token", "1.5"), ("sequence-truncate", "sequence", "1.5"),
    ("token-mask", "token", f"{1 / 1.5}_1.5"), ("sequence-mask", "sequence", f"{1 / 1.5}_1.5"),
])
def test_rollout_correction_matches_verl(mode, level, threshold):
    lp, old, sampler, adv, mask = tensors(seed=1)
    weights, _ = compute_rollout_correction_weights(old - sampler, mask, rollout_is=level,
                                                    rollout_is_threshold=threshold)
    cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    their_loss, their_grad = theirs("vanilla", lp, old, adv, mask, "token-mean", cfg, weights=weights)
    our_loss, our_grad = ours("ppo_dual_clip", lp, old, adv, mask, sampler=sampler, clip_high=0.28,
                              rollout_correction=mode, rollout_correction_cap=1.5)
    torch.testing.assert_close(our_loss, their_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-6, atol=1e-7)


# --- advantage estimators: 4 prompts x 4 completions, binary-ish rewards without ties for the best one
REWARDS = torch.tensor([[1.0, 0.0, 0.5, 0.2], [0.0, 0.0, 0.0, 1.0], [0.3, 0.9, 0.1, 0.0], [0.0, 0.7, 0.0, 0.4]],
                       dtype=torch.float64)
LENGTHS = torch.tensor([[3, 7, 5, 2], [6, 1, 4, 7], [2, 2, 7, 5], [4, 3, 6, 1]])


def verl_inputs():
    P, G = REWARDS.shape
    mask = (torch.arange(7)[None, :] < LENGTHS.flatten()[:, None]).double()  # (P·G, 7)
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(P * G), LENGTHS.flatten() - 1] = REWARDS.flatten()  # outcome reward on the last token
    index = np.repeat(np.arange(P), G)
    return token_rewards, mask, index


ESTIMATORS = {  # our estimator -> (verl estimator, extra verl kwargs)
    "group": ("grpo", {}),
    "group-no-std": ("grpo", {"norm_adv_by_std_in_grpo": False}),
    "rloo": ("rloo", {}),
    "reinforce++": ("reinforce_plus_plus", {}),
    "reinforce++-baseline": ("reinforce_plus_plus_baseline", {}),
    "grpo-passk": ("grpo_passk", {}),
    "opo": ("opo", {}),
    "gpg": ("gpg", {}),
}


@pytest.mark.parametrize("estimator", list(ESTIMATORS))
def test_advantage_estimator_matches_verl(estimator):
    verl_name, kw = ESTIMATORS[estimator]
    token_rewards, mask, index = verl_inputs()
    config = AlgoConfig(gamma=1.0, norm_adv_by_std_in_grpo=kw.pop("norm_adv_by_std_in_grpo", True))
    fn = core_algos.get_adv_estimator_fn(verl_name)
    their, _ = fn(token_level_rewards=token_rewards, response_mask=mask, index=index, config=config,
                  norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo, **kw)
    our = group_advantages(REWARDS, estimator, lengths=LENGTHS).flatten()
    torch.testing.assert_close(our[:, None] * mask, their, rtol=1e-6, atol=1e-6)


def test_remax_matches_verl():
    token_rewards, mask, _ = verl_inputs()
    greedy = torch.tensor([0.5, 1.0, 0.0, 0.7], dtype=torch.float64)
    their, _ = core_algos.get_adv_estimator_fn("remax")(
        token_level_rewards=token_rewards, reward_baselines=greedy.repeat_interleave(4), response_mask=mask,
        config=AlgoConfig())
    our = group_advantages(REWARDS, "remax", greedy_rewards=greedy).flatten()
    # verl's returns-to-go: the outcome reward counts from every token of the completion (γ = 1)
    torch.testing.assert_close(our[:, None] * mask, their, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode,threshold", [("sequence-truncate", "5.0"), ("sequence-mask", f"{1 / 5.0}_5.0")])
def test_sequence_correction_of_an_extreme_token_matches_verl(mode, threshold):
    """Sequence 0: one token at old − sampler = 25, its 6 neighbours summing to −24: verl clamps only the sum (w =
    e^1), so must we (clamping each token first gave e^−4, or dropped the sequence under a mask)."""
    lp, old, sampler, adv, mask = tensors(seed=2)
    d = torch.full((T,), -4.0, dtype=torch.float64)
    d[3] = 25.0
    sampler = sampler.clone()
    sampler[0] = old[0] - d
    weights, _ = compute_rollout_correction_weights(old - sampler, mask, rollout_is="sequence",
                                                    rollout_is_threshold=threshold)
    assert weights[0, 0].item() == pytest.approx(math.e, rel=1e-9)
    cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    their_loss, their_grad = theirs("vanilla", lp, old, adv, mask, "token-mean", cfg, weights=weights)
    our_loss, our_grad = ours("ppo_dual_clip", lp, old, adv, mask, sampler=sampler, clip_high=0.28,
                              rollout_correction=mode, rollout_correction_cap=5.0)
    torch.testing.assert_close(our_loss, their_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("estimator", ["rloo", "reinforce++-baseline"])
def test_one_completion_per_prompt_matches_verl(estimator):
    """Groups of one completion: verl uses no group baseline (mean 0) for them; so do we."""
    rewards = REWARDS[:, :1].clone()
    lengths = LENGTHS[:, :1]
    P = rewards.shape[0]
    mask = (torch.arange(7)[None, :] < lengths.flatten()[:, None]).double()
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(P), lengths.flatten() - 1] = rewards.flatten()
    verl_name = ESTIMATORS[estimator][0]
    their, _ = core_algos.get_adv_estimator_fn(verl_name)(
        token_level_rewards=token_rewards, response_mask=mask, index=np.arange(P), config=AlgoConfig(gamma=1.0))
    our = group_advantages(rewards, estimator, lengths=lengths).flatten()
    torch.testing.assert_close(our[:, None] * mask, their, rtol=1e-6, atol=1e-6)
