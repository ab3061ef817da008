"""GTPO (algorithms/gtpo.py) on small groups computed by hand: the conflict tokens from the start and from the end (a
run shared by completions of both signs), the weights δ (2 on a positive completion's conflicts, 0 on a negative
one's, forward and backward multiplied), the entropy filter on π_old's mean entropy, the normaliser (number of
conflict tokens, at least 1), a group of one, all-equal rewards; the loss (−Â_it·r_it, no clip, token mean per
completion); the registry's contract (the engines refuse it, the probe synthesises its token ids)."""

from __future__ import annotations

import pytest
import torch

from algorithms import PolicyBatch, get_objective
from algorithms.gtpo import conflict_masks, group_centred, gtpo_advantages
from algorithms.probe import Regime, gradient, make_batch

# one group of three completions (token id 0 is padding): completion 0 correct (Â = 2/3), 1 and 2 wrong (Â = −1/3).
# From the start: 0 and 1 share "5 6" (then 7 / 9; their "8" at t = 3 is no conflict: the run broke at t = 2); 2 shares
# only "5". From the end: all three end with "8" (then 7 / 9 / 2; 0 and 1 share "6" two back, after the break).
IDS = torch.tensor([[[5, 6, 7, 8, 0],
                     [5, 6, 9, 8, 0],
                     [5, 3, 4, 2, 8]]])
MASK = torch.tensor([[[1, 1, 1, 1, 0],
                      [1, 1, 1, 1, 0],
                      [1, 1, 1, 1, 1]]], dtype=torch.float64)
REWARDS = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
# π_old's entropies: mean 0.5 (kept), 0.2 (kept), 1.0 (> 0.7: dropped); garbage on padding
ENT = torch.tensor([[[0.4, 0.6, 0.5, 0.5, 9.0],
                     [0.2, 0.2, 0.2, 0.2, 9.0],
                     [1.0, 1.0, 1.0, 1.0, 1.0]]], dtype=torch.float64)

FWD = [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
BWD = [[0, 0, 0, 1, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]
# δ = δ_fwd·δ_bwd: completion 0 (positive) 2 on its conflicts; 1 and 2 (negative) 0 on theirs; 0 on padding
DELTA = [[2, 2, 1, 2, 0], [0, 0, 1, 0, 0], [0, 1, 1, 1, 0]]
N_CONFLICT = [3, 3, 2]  # tokens that are forward or backward conflicts
SHAPED = [2 / 3 - 0.1 * 0.5, -1 / 3 - 0.1 * 0.2, 0.0]  # Â − 0.1·H̄ when H̄ <= 0.7, else 0


def f64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def run(rewards=REWARDS, ids=IDS, mask=MASK, ent=ENT, **kw):
    return gtpo_advantages(rewards, ids, mask, ent, **kw)


def test_the_advantage_is_the_reward_minus_the_group_mean():
    _, d = run()
    torch.testing.assert_close(d["adv"], f64([[2 / 3, -1 / 3, -1 / 3]]))


def test_forward_conflicts_are_the_run_shared_from_the_start_by_both_signs():
    fwd, _ = conflict_masks(IDS, MASK, group_centred(REWARDS))
    assert fwd[0].long().tolist() == FWD


def test_backward_conflicts_are_the_run_shared_from_each_completions_end():
    _, bwd = conflict_masks(IDS, MASK, group_centred(REWARDS))
    assert bwd[0].long().tolist() == BWD


def test_conflicts_need_a_completion_of_each_sign():
    """The same completions with completion 2 now correct too: completion 1 (the only negative) meets the positives
    at "5 6" from the start and "8" from the end; completion 2 (positive) shares "5" with completion 1 only."""
    rewards = f64([[1.0, 0.0, 1.0]])
    fwd, bwd = conflict_masks(IDS, MASK, group_centred(rewards))
    assert fwd[0].long().tolist() == [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
    assert bwd[0].long().tolist() == BWD
    # two positives alone (the negative gone: Â = 0 for all): no conflict at all
    fwd, bwd = conflict_masks(IDS[:, :2], MASK[:, :2], f64([[0.5, 0.0]]))
    assert not fwd.any() and not bwd.any()


def test_the_weights_are_two_on_a_positive_conflict_zero_on_a_negative_one_and_multiply():
    _, d = run()
    assert d["delta"][0].tolist() == DELTA
    # both directions on one token: a completion that is all conflict gets δ = 2·2 on its shared tokens
    ids = torch.tensor([[[3, 4], [3, 4]]])
    _, d = run(f64([[1.0, 0.0]]), ids, torch.ones(1, 2, 2, dtype=torch.float64), torch.zeros(1, 2, 2,
                                                                                            dtype=torch.float64))
    assert d["delta"][0].tolist() == [[4, 4], [0, 0]]
    # the weights are the config's: W = 3, 0.5 on a negative one's
    _, d = run(conflict_weight=3.0, conflict_weight_neg=0.5)
    assert d["delta"][0].tolist() == [[3, 3, 1, 3, 0], [0.5, 0.5, 1, 0.5, 0], [0.5, 1, 1, 1, 0.5]]


def test_the_entropy_filter_shapes_low_entropy_completions_and_drops_the_others():
    _, d = run()
    torch.testing.assert_close(d["entropy"], f64([[0.5, 0.2, 1.0]]))  # (padding left out of the mean)
    torch.testing.assert_close(d["shaped"], f64([SHAPED]))
    # the threshold keeps H̄ = 0.7 itself, drops what is above
    ent = ENT.clone()
    ent[0, 2] = 0.7
    _, d = run(ent=ent)
    torch.testing.assert_close(d["shaped"][0, 2], f64(-1 / 3 - 0.07))
    _, d = run(entropy_threshold=0.3)  # now completion 0 (H̄ = 0.5) leaves the update as well
    torch.testing.assert_close(d["shaped"], f64([[0.0, -1 / 3 - 0.02, 0.0]]))


def test_the_token_advantages_are_the_shaped_advantage_times_delta_over_the_conflict_count():
    tok, d = run()
    assert d["n_conflict"][0].tolist() == N_CONFLICT
    want = f64([[SHAPED[i] * DELTA[i][t] / N_CONFLICT[i] for t in range(5)] for i in range(3)])
    torch.testing.assert_close(tok[0], want)
    assert (tok[0, :2, 4] == 0).all()  # padding


def test_a_completion_without_conflicts_has_normaliser_one():
    """Completions with nothing in common: δ = 1, n = 1, Â_it = Â'_i on every token."""
    ids = torch.tensor([[[1, 2, 3], [4, 5, 6]]])
    ent = torch.full((1, 2, 3), 0.3, dtype=torch.float64)
    tok, d = run(f64([[1.0, 0.0]]), ids, torch.ones(1, 2, 3, dtype=torch.float64), ent)
    assert d["n_conflict"].tolist() == [[1, 1]] and (d["delta"] == 1).all()
    torch.testing.assert_close(tok[0], f64([[0.5 - 0.03] * 3, [-0.5 - 0.03] * 3]))


def test_a_group_of_one_only_has_the_entropy_shaping():
    ids = torch.tensor([[[7, 8, 9]]])
    m = torch.ones(1, 1, 3, dtype=torch.float64)
    tok, d = run(f64([[1.0]]), ids, m, torch.full((1, 1, 3), 0.4, dtype=torch.float64))
    assert d["adv"].tolist() == [[0.0]] and not d["forward"].any() and not d["backward"].any()
    torch.testing.assert_close(tok, torch.full((1, 1, 3), -0.04, dtype=torch.float64))
    tok, _ = run(f64([[1.0]]), ids, m, torch.full((1, 1, 3), 0.9, dtype=torch.float64))
    assert (tok == 0).all()


@pytest.mark.parametrize("value", [1.0, 0.0, 0.1])
def test_all_equal_rewards_give_no_conflict_and_the_entropy_shaping_alone(value):
    """Identical completions of an all-equal group: Â = 0 exactly (0.1·3/3 has no rounding residue here), so no
    completion has a sign and nothing is a conflict; each keeps −0.1·H̄_i (the code's shaping at Â = 0)."""
    ids = torch.tensor([[[4, 4, 2], [4, 4, 2], [4, 4, 2]]])
    ent = f64([[[0.2] * 3, [0.6] * 3, [0.8] * 3]])
    tok, d = run(torch.full((1, 3), value, dtype=torch.float64), ids, torch.ones(1, 3, 3, dtype=torch.float64), ent)
    assert (d["adv"] == 0).all() and not d["forward"].any() and not d["backward"].any()
    torch.testing.assert_close(tok[0], f64([[-0.02] * 3, [-0.06] * 3, [0.0] * 3]))


def test_the_objective_groups_rows_and_keeps_groups_apart():
    """``advantages_from_token_stats`` on two groups flattened prompt-major: each group's own result; a second group
    with the same token ids and opposite rewards does not create conflicts in the first."""
    obj = get_objective("gtpo")
    other = torch.tensor([[0.0, 1.0, 1.0]], dtype=torch.float64)
    rewards = torch.cat([REWARDS, other]).reshape(-1)
    ids, mask, ent = (torch.cat([x, x]).reshape(6, 5) for x in (IDS, MASK, ENT))
    got = obj.advantages_from_token_stats(rewards, mask, group_size=3, old_entropy=ent, token_ids=ids)
    want0, _ = run()
    want1, _ = run(other)
    torch.testing.assert_close(got, torch.cat([want0[0], want1[0]]))
    with pytest.raises(ValueError, match="token_ids and old_entropy"):
        obj.advantages_from_token_stats(rewards, mask, group_size=3, old_entropy=ent)
    with pytest.raises(ValueError, match="groups of 4"):
        obj.advantages_from_token_stats(rewards, mask, group_size=4, old_entropy=ent, token_ids=ids)


def test_the_objective_declares_what_it_needs():
    obj = get_objective("gtpo")
    assert obj.uses_token_advantages and obj.token_estimator is None
    assert obj.token_advantage_needs == ("token_ids", "old_entropy")
    assert obj.batch_fields == {"token_advantages"} and obj.skips_zero_advantage
    assert obj.advantages(f64([[1.0, 0.0, 0.0, 1.0]])).tolist() == [[0.5, -0.5, -0.5, 0.5]]
    for bad in ({"advantage_estimator": "group"}, {"ratio_level": "sequence"}, {"off_policy_mask_threshold": 0.5},
                {"conflict_weight": -1.0}):
        with pytest.raises(ValueError):
            get_objective("gtpo", **bad)


def test_the_loss_is_the_unclipped_ratio_times_the_token_advantage_token_mean_per_completion():
    """−mean_i mean_t Â_it·r_it: the gradient w.r.t. lp_it is −Â_it·r_it/(n_tokens_i·B), with no clip at r = 3."""
    obj = get_objective("gtpo")
    B, T = 2, 4
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float64)
    tok = f64([[0.4, -0.2, 0.0, 1.0], [0.3, 0.3, 0.0, 0.0]])
    lp = torch.log(f64([[0.5, 0.2, 0.3, 0.9], [0.6, 0.1, 0.5, 0.5]])).requires_grad_(True)
    old = lp.detach() - torch.log(f64([[1.0, 3.0, 1.0, 0.5], [1.0, 1.0, 1.0, 1.0]]))  # r = 3 at (0, 1), 0.5 at (0, 3)
    batch = PolicyBatch(logprobs=lp, old_logprobs=old, advantages=torch.zeros(B, dtype=torch.float64), mask=mask,
                        max_length=T, token_advantages=tok)
    loss, m = obj.checked_loss(batch)
    r = torch.exp(lp.detach() - old)
    n = mask.sum(-1, keepdim=True)
    torch.testing.assert_close(loss.detach(), (-(tok * r * mask) / n).sum() / B)
    (g,) = torch.autograd.grad(loss, [lp])
    torch.testing.assert_close(g, -tok * r * mask / n / B)
    assert float(m["objective/clip_frac_low"]) == 0 and float(m["objective/clip_frac_high"]) == 0


def test_the_probe_synthesises_token_ids_with_shared_runs_and_gtpo_differs_from_grpo():
    """The probe hands GTPO token ids in which completions of a group share runs from the start and the end, so
    conflicts act (δ ≠ 1 somewhere), and its gradient is not grpo's."""
    from algorithms.probe import _token_advantages, _token_ids

    pb = make_batch(Regime(completions=16, group_size=4, max_length=64))
    ids = _token_ids(pb)
    assert (ids[pb.mask == 0] == 0).all() and (ids[pb.mask > 0] > 0).all()
    obj = get_objective("gtpo")
    G = 4
    _, d = gtpo_advantages(pb.rewards, ids.view(-1, G, ids.shape[1]), pb.mask.view(-1, G, ids.shape[1]),
                           pb.old_entropy.view(-1, G, ids.shape[1]))
    assert (d["delta"][pb.mask.view(d["delta"].shape) > 0] != 1).any()
    tok = _token_advantages(obj, pb)
    assert tok.shape == pb.mask.shape and torch.isfinite(tok).all() and (tok != 0).any()
    g_gtpo, _ = gradient("gtpo", {}, [pb])
    g_grpo, _ = gradient("grpo", {}, [pb])
    assert torch.isfinite(g_gtpo).all() and not torch.allclose(g_gtpo, g_grpo)
