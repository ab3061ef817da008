"""The per-token optimal baselines (algorithms.token_baseline_advantages) agree with verl 0.9.1's
``optimal_token_baseline`` and ``tir_optimal_token_baseline`` on the same tensors (CPU), and ``sum_pi_squared`` with
verl's ``calculate_sum_pi_squared_from_logits``.

Runs in `tox -e verl`; skipped where verl is absent. Our tensors are (P, G, T) groups; verl's are (P·G, T) rows with
a prompt index, so each case is flattened for verl and compared row by row.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (tox -e verl)")

from verl.utils.torch_functional import calculate_sum_pi_squared_from_logits  # noqa: E402

from algorithms import TOKEN_ESTIMATORS, token_baseline_advantages  # noqa: E402
from algorithms.advantages import sum_pi_squared  # noqa: E402
from bench.engines.verl import TOKEN_ADV_ESTIMATORS  # noqa: E402

pytestmark = pytest.mark.verl
P, G, T, V = 4, 4, 9, 11
# completion lengths: ties for the longest (row 0), a strictly longest one (rows 1, 2), an empty completion (row 3)
LENGTHS = torch.tensor([[9, 9, 4, 2], [3, 8, 5, 1], [6, 6, 7, 2], [5, 0, 3, 4]])


def inputs(seed: int = 0, dense: bool = False, gaps: bool = False):
    """(P, G, T) rewards, mask, old log-probs of sampled tokens and Σπ² of a random sampling distribution."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T) < LENGTHS[..., None]).double()
    if gaps:  # tool-output tokens inside a completion (multi-turn): holes in the mask, the same count of tokens
        holes = torch.zeros(P, G, T + 3, dtype=torch.float64)
        for p in range(P):
            for i in range(G):
                n = int(LENGTHS[p, i])
                where = torch.randperm(min(T, n + 3), generator=g)[:n].sort().values
                holes[p, i, where] = 1.0
        mask = holes[..., :T]
    logits = 2.0 * torch.randn(P, G, T, V, generator=g, dtype=torch.float64)
    probs = logits.softmax(-1)
    token = torch.multinomial(probs.reshape(-1, V), 1, generator=g).reshape(P, G, T)
    old = probs.log().gather(-1, token[..., None])[..., 0]
    s2 = probs.pow(2).sum(-1)
    if dense:
        rewards = torch.randn(P, G, T, generator=g, dtype=torch.float64) * mask
    else:  # an outcome reward on each completion's last token
        rewards = torch.zeros(P, G, T, dtype=torch.float64)
        last = (mask * torch.arange(1, T + 1)).argmax(-1)
        outcome = torch.rand(P, G, generator=g, dtype=torch.float64).round()
        rewards.scatter_(-1, last[..., None], outcome[..., None] * (LENGTHS[..., None] > 0))
    rho = torch.rand(P, G, T, generator=g, dtype=torch.float64) * 2
    return rewards, mask, old, s2, rho, logits


def theirs(estimator, rewards, mask, old, s2, rho=None, **kw):
    flat = [None if x is None else x.reshape(-1, x.shape[-1]) for x in (rewards, mask, old, s2, rho)]
    index = np.repeat(np.arange(rewards.shape[0]), rewards.shape[1])
    fn = core_algos.get_adv_estimator_fn(TOKEN_ADV_ESTIMATORS[estimator])
    adv, ret = fn(token_level_rewards=flat[0], response_mask=flat[1], index=index, old_log_probs=flat[2],
                  sum_pi_squared=flat[3], rollout_is_weights=flat[4], **kw)
    return adv.reshape(rewards.shape), ret.reshape(rewards.shape)


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_token_baseline_matches_verl(estimator, zero_tail, dense, weighted):
    rewards, mask, old, s2, rho, _ = inputs(seed=1, dense=dense)
    rho = rho if weighted else None
    their_adv, their_ret = theirs(estimator, rewards, mask, old, s2, rho, handle_zero_tail=zero_tail)
    our_adv, our_ret = token_baseline_advantages(estimator, rewards, mask, old, s2, is_weights=rho,
                                                 zero_tail=zero_tail)
    torch.testing.assert_close(our_ret, their_ret, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(our_adv, their_adv, rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
@pytest.mark.parametrize("zero_tail", [True, False])
def test_token_baseline_with_gaps_in_the_mask_matches_verl(estimator, zero_tail):
    """Multi-turn masks (holes where tool outputs were): the two estimators part ways (absolute position vs k-th
    counted token), and each still matches its verl counterpart."""
    rewards, mask, old, s2, _, _ = inputs(seed=2, gaps=True)
    their, _ = theirs(estimator, rewards, mask, old, s2, handle_zero_tail=zero_tail)
    ours, _ = token_baseline_advantages(estimator, rewards, mask, old, s2, zero_tail=zero_tail)
    torch.testing.assert_close(ours, their, rtol=1e-7, atol=1e-7)
    other = [e for e in TOKEN_ESTIMATORS if e != estimator][0]
    assert not torch.allclose(token_baseline_advantages(other, rewards, mask, old, s2, zero_tail=zero_tail)[0], ours)


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
def test_groups_of_one_match_verl(estimator):
    rewards, mask, old, s2, _, _ = inputs(seed=3)
    one = [x[:, :1].clone() for x in (rewards, mask, old, s2)]
    their, _ = theirs(estimator, *one)
    ours, ret = token_baseline_advantages(estimator, *one)
    torch.testing.assert_close(ours, their, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ours, ret)  # no baseline: the advantage is the return


def test_sum_pi_squared_matches_verl():
    logits = inputs(seed=4)[-1]
    torch.testing.assert_close(sum_pi_squared(logits), calculate_sum_pi_squared_from_logits(logits))
    torch.testing.assert_close(sum_pi_squared(logits), logits.softmax(-1).pow(2).sum(-1))


def test_float32_matches_verl():
    """Training tensors are float32: same values at float32 precision (verl casts the baseline, we compute in the
    rewards' dtype)."""
    rewards, mask, old, s2, _, _ = inputs(seed=5)
    args = [x.float() for x in (rewards, mask, old, s2)]
    for estimator in TOKEN_ESTIMATORS:
        their, _ = theirs(estimator, *args)
        ours, _ = token_baseline_advantages(estimator, *args)
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, their, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("estimator", TOKEN_ESTIMATORS)
def test_a_group_with_one_nonempty_completion_matches_verl(estimator):
    """Groups of two where one completion has no tokens, without the zero tail: verl's tir leaves the empty one out
    (a group of one: Â = G), its position-aligned estimator keeps it (B_t = the other's own return: Â ≈ 0)."""
    rewards, mask, old, s2, _, _ = inputs(seed=6)
    two = [x[:, :2].clone() for x in (rewards, mask, old, s2)]
    two[1][:, 1] = 0.0
    two[0][:, 1] = 0.0
    their, ret = theirs(estimator, *two, handle_zero_tail=False)
    ours, _ = token_baseline_advantages(estimator, *two, zero_tail=False)
    torch.testing.assert_close(ours, their, rtol=1e-7, atol=1e-7)
    assert torch.allclose(ours, ret) == (estimator == "tir-optimal-token-baseline")
