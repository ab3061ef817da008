"""PPO's critic side (algorithms/critic.py) agrees with verl 0.9.1's ``compute_gae_advantage_return`` and
``compute_value_loss`` on the same tensors (CPU, float64): advantages and returns on completion tokens, the value
loss and its gradient w.r.t. the predicted values, the clip fraction.

Runs in `tox -e verl`; skipped where verl is absent. verl leaves its whitened advantages (and returns = values) on
padding positions; ours are 0 there, so the comparison is over the mask, and each case puts garbage on the padding.
verl's ``masked_mean`` divides by (count + 1e-8): its whitened advantages differ from ours by ~1e-8 relative
(``WHITE``); the returns, before whitening, agree to rounding.
"""

from __future__ import annotations

import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (tox -e verl)")

from algorithms.critic import gae, outcome_token_rewards, value_loss  # noqa: E402

pytestmark = pytest.mark.verl
B, T = 8, 9
WHITE = {"rtol": 1e-7, "atol": 1e-8}  # (verl's count + 1e-8)
EXACT = {"rtol": 1e-12, "atol": 1e-12}
LENGTHS = torch.tensor([9, 3, 5, 9, 1, 6, 4, 2])


def tensors(seed: int = 0, dense: bool = False):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < LENGTHS[:, None]).double()
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.where(mask > 0, values, 5.0 + torch.rand(B, T, generator=g, dtype=torch.float64))  # garbage
    outcome = torch.rand(B, generator=g, dtype=torch.float64).round()
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64) * mask if dense else outcome_token_rewards(outcome,
                                                                                                           mask)
    return rewards, values, mask


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 1.0), (1.0, 0.5)])
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_gae_equals_verl(gamma, lam, dense, seed):
    rewards, values, mask = tensors(seed, dense)
    ours_adv, ours_ret = gae(rewards, values, mask, gamma, lam)
    their_adv, their_ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    on = mask > 0
    torch.testing.assert_close(ours_adv[on], their_adv[on], **WHITE)
    torch.testing.assert_close(ours_ret[on], their_ret[on], **EXACT)
    assert torch.all(ours_adv[~on] == 0) and torch.all(ours_ret[~on] == 0)


def test_gae_with_gaps_in_the_mask_equals_verl():
    """Tokens the mask skips inside a completion (tool outputs in verl's multi-turn rollouts) carry the next value
    and the running advantage through, as verl's loop does."""
    rewards, values, mask = tensors(3, dense=True)
    mask = mask.clone()
    mask[0, 2] = mask[0, 5] = mask[3, 1] = 0.0
    ours_adv, ours_ret = gae(rewards * mask, values, mask, 0.97, 0.9)
    their_adv, their_ret = core_algos.compute_gae_advantage_return(rewards * mask, values, mask, 0.97, 0.9)
    on = mask > 0
    torch.testing.assert_close(ours_adv[on], their_adv[on], **WHITE)
    torch.testing.assert_close(ours_ret[on], their_ret[on], **EXACT)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("clip", [0.5, 0.05])
def test_value_loss_equals_verl(aggregation, clip):
    rewards, old_values, mask = tensors(4)
    _, returns = core_algos.compute_gae_advantage_return(rewards, old_values, mask, 1.0, 1.0)
    g = torch.Generator().manual_seed(9)
    vpreds = (old_values + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    ours, metrics = value_loss(vpreds, returns, old_values, mask, clip, aggregation, max_length=T)
    (g_ours,) = torch.autograd.grad(ours, vpreds)
    theirs, their_clipfrac = core_algos.compute_value_loss(vpreds, returns, old_values, mask, clip,
                                                           loss_agg_mode=aggregation)
    (g_theirs,) = torch.autograd.grad(theirs, vpreds)
    tol = WHITE if aggregation == "seq-mean-token-mean" else EXACT  # (verl: a completion's tokens + 1e-8)
    torch.testing.assert_close(ours, theirs, **tol)
    torch.testing.assert_close(g_ours, g_theirs, **tol)
    torch.testing.assert_close(metrics["critic/value_clip_frac"], torch.as_tensor(their_clipfrac, dtype=torch.float64))
    assert 0 < float(metrics["critic/value_clip_frac"]) < 1  # the clip acts on some tokens, not all


def test_ppo_loss_with_token_advantages_equals_verl_vanilla_without_dual_clip():
    """The policy side: ``ppo``'s loss on per-token advantages is verl's vanilla PPO loss (token-mean, clip 0.2) when
    verl's dual clip cannot act (every advantage >= 0 here, so its clip_ratio_c = 3 never binds)."""
    from verl.workers.config import ActorConfig

    from algorithms import PolicyBatch, get_objective

    rewards, values, mask = tensors(5)
    adv, _ = gae(rewards, values, mask)
    adv = adv.abs()
    g = torch.Generator().manual_seed(2)
    lp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    old = (lp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).detach().clamp(max=-1e-3)
    obj = get_objective("ppo")
    batch = PolicyBatch(logprobs=lp, old_logprobs=old, advantages=torch.zeros(B, dtype=torch.float64), mask=mask,
                        max_length=T, token_advantages=adv)
    ours = obj.loss(batch)[0]
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                      loss_agg_mode="token-mean")
    fn = core_algos.get_policy_loss_fn("vanilla")
    theirs = fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask, loss_agg_mode="token-mean",
                config=cfg)[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    (g_ours,) = torch.autograd.grad(ours, lp)
    (g_theirs,) = torch.autograd.grad(theirs, lp)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-10, atol=1e-12)
