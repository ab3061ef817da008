"""Clip-Cov and KL-Cov (arXiv 2505.22617) against verl 0.9.1's ``compute_policy_loss_clip_cov`` and
``compute_policy_loss_kl_cov`` on the same CPU tensors: loss value and gradient w.r.t. the current log-probs.

- Clip-Cov's random draw: verl calls ``torch.randperm(n)`` on the GLOBAL generator (no generator argument) over the
  candidate tokens in row-major order (``torch.nonzero``); pobench calls ``torch.randperm(n, generator=g)`` over the
  same candidates in the same order. Each case seeds the global generator with ``torch.manual_seed(s)`` before verl's
  call and hands pobench ``torch.Generator().manual_seed(s)`` (the native loop's and TRL's path: a generator is always
  passed), the same CPU Mersenne-Twister stream, so both draw the same permutation. Cases where the draw takes a
  strict subset check that two seeds select differently (so the RNG is really controlled, not irrelevant); the
  ``all-candidates`` cases take every candidate (the selection is then determined, no RNG involved).
- KL-Cov: pobench's default surrogate ``unclipped`` is verl's loss; pobench's ``surrogate="clipped"`` has no verl
  counterpart and is not compared. verl's ``ppo_kl_coef`` is our ``kl_cov_coef``, ``kl_cov_ratio`` our
  ``kl_cov_frac``. Defaults differ (docs/objectives.md): verl ``kl_cov_ratio`` 2e-4, ``ppo_kl_coef`` 0.1 (its
  dataclass), ``clip_ratio`` 0.2 for Clip-Cov; ours are the released scripts' 2e-3, 1 and 1 / 1. The cases pass
  both sides the same values.
- pobench's β·KL to the reference (``kl_coef``) is verl's separate ``use_kl_loss`` and is off here (``kl_coef=0``).

Runs in `tox -e verl`; skipped where verl is absent.
"""

from __future__ import annotations

import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (tox -e verl)")

from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

from algorithms import PolicyBatch, get_objective  # noqa: E402
from algorithms.policy_gradient import clipped_surrogate  # noqa: E402
from algorithms.selective import centred_covariance  # noqa: E402

pytestmark = pytest.mark.verl
B, T = 8, 12
LENGTHS = torch.tensor([12, 3, 7, 12, 1, 9, 5, 10])
CLOSE = {"rtol": 1e-6, "atol": 1e-7}


def tensors(seed: int = 0, noise: float = 0.3):
    """lp in (−5, 0) and Â of std 2, so many tokens have a covariance inside verl's band (1, 5)."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < LENGTHS[:, None]).double()
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 5 - 0.05
    old = (lp + noise * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    sampler = old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = 2 * torch.randn(B, generator=g, dtype=torch.float64)
    return lp, old, sampler, adv, mask


def verl_loss(name, lp, old, adv, mask, agg, seed, weights=None, **kw):
    lp = lp.clone().requires_grad_(True)
    clip = {k: kw.pop(k) for k in ("clip_ratio", "clip_ratio_low", "clip_ratio_high") if k in kw}
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                         policy_loss=PolicyLossConfig(loss_mode=name, **kw), **clip)
    torch.manual_seed(seed)  # verl's clip_cov draws with the global generator
    loss, metrics = core_algos.get_policy_loss_fn(name)(
        old_log_prob=old, log_prob=lp, advantages=adv[:, None] * mask, response_mask=mask, loss_agg_mode=agg,
        config=config, rollout_is_weights=weights)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


def pobench_loss(name, lp, old, adv, mask, seed, sampler=None, **overrides):
    lp = lp.clone().requires_grad_(True)
    batch = PolicyBatch(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, max_length=T,
                        sampler_logprobs=sampler)
    loss, metrics = get_objective(name, kl_coef=0.0, **overrides).loss(
        batch, generator=torch.Generator().manual_seed(seed))
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


# ------------------------------------------------------------------------------------------------ Clip-Cov
#: case -> (tensor set, verl ActorConfig / PolicyLossConfig kwargs, pobench overrides). Each draw takes k =
#: max(1, ⌊r·N⌋) of the candidates (N = 59 completion tokens here)
CLIP_COV = {
    # the released scripts: clip 1 / 1 (r clipped at 2, no lower clip); k = 3 of more candidates: a random draw
    "released-clip": ({}, {"clip_ratio_low": 1.0, "clip_ratio_high": 1.0, "clip_cov_ratio": 0.05},
                      {"clip_cov_frac": 0.05}),
    # verl's default clip 0.2 / 0.2 far off-policy: the PPO clip removes in-band tokens from the candidates
    "ppo-clip-far": ({"seed": 1, "noise": 1.0}, {"clip_ratio": 0.2, "clip_cov_ratio": 0.05},
                     {"clip_low": 0.2, "clip_high": 0.2, "clip_cov_frac": 0.05}),
    # asymmetric clip (ε_low = 0.1, ε_high = 0.5) and a narrower band (cov_low, cov_high) = (0.5, 2)
    "asymmetric-band": ({"seed": 3, "noise": 0.6}, {"clip_ratio_low": 0.1, "clip_ratio_high": 0.5,
                                                    "clip_cov_ratio": 0.04, "clip_cov_lb": 0.5, "clip_cov_ub": 2.0},
                        {"clip_low": 0.1, "clip_high": 0.5, "clip_cov_frac": 0.04, "cov_low": 0.5, "cov_high": 2.0}),
    # the count exceeds the candidates: every candidate is taken, no draw decides anything
    "all-candidates": ({"seed": 1, "noise": 1.0}, {"clip_ratio_low": 0.1, "clip_ratio_high": 0.5,
                                                   "clip_cov_ratio": 0.9},
                       {"clip_low": 0.1, "clip_high": 0.5, "clip_cov_frac": 0.9}),
    # the default fraction 2e-4: k = 1 token
    "one-token": ({}, {"clip_ratio_low": 1.0, "clip_ratio_high": 1.0, "clip_cov_ratio": 2e-4}, {}),
}


def candidates(lp, old, adv, mask, ours):
    """pobench's reading of verl's candidates: completion tokens the PPO clip kept, covariance strictly in the band."""
    obj = get_objective("clip_cov", kl_coef=0.0, **ours)
    c = obj.config
    b = PolicyBatch(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, max_length=T)
    _, low, high = clipped_surrogate((lp - old).exp(), adv[:, None], c.clip_low, c.clip_high)
    cov = centred_covariance(b)
    return (mask > 0) & ~(low | high) & (cov > c.cov_low) & (cov < c.cov_high), low | high, cov


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("case", list(CLIP_COV))
def test_clip_cov_matches_verl(case, agg, seed):
    tensor_set, theirs_kw, ours_kw = CLIP_COV[case]
    lp, old, _, adv, mask = tensors(**tensor_set)
    their_loss, their_grad, their_m = verl_loss("clip_cov", lp, old, adv, mask, agg, seed, **theirs_kw)
    our_loss, our_grad, our_m = pobench_loss("clip_cov", lp, old, adv, mask, seed, aggregation=agg, **ours_kw)
    torch.testing.assert_close(our_loss, their_loss, **CLOSE)
    torch.testing.assert_close(our_grad, their_grad, **CLOSE)
    # verl's pg_clipfrac is the fraction of completion tokens its draw zeroed
    assert our_m["objective/detached_frac"].item() == pytest.approx(their_m["actor/pg_clipfrac"], rel=1e-6)
    assert our_m["objective/cov_selected"].item() >= 1


def test_the_clip_cov_cases_exercise_the_draw_and_the_exclusion():
    """So the parity above is not that of an empty or a fixed selection: the random cases draw a strict subset of
    several candidates and two seeds select differently; in ppo-clip-far the PPO clip removes in-band tokens; in
    all-candidates the count covers every candidate."""
    for case in ("released-clip", "ppo-clip-far", "asymmetric-band"):
        tensor_set, theirs_kw, ours_kw = CLIP_COV[case]
        lp, old, _, adv, mask = tensors(**tensor_set)
        cand, _, _ = candidates(lp, old, adv, mask, ours_kw)
        k = max(1, int(ours_kw["clip_cov_frac"] * int(mask.sum())))
        assert 1 < k < int(cand.sum()), case
        grads = [verl_loss("clip_cov", lp, old, adv, mask, "token-mean", s, **theirs_kw)[1] for s in (0, 1, 7)]
        assert not torch.equal(grads[0] == 0, grads[1] == 0) or not torch.equal(grads[0] == 0, grads[2] == 0), case
    tensor_set, _, ours_kw = CLIP_COV["ppo-clip-far"]
    lp, old, _, adv, mask = tensors(**tensor_set)
    _, clipped, cov = candidates(lp, old, adv, mask, ours_kw)
    assert ((mask > 0) & clipped & (cov > 1) & (cov < 5)).any()
    tensor_set, _, ours_kw = CLIP_COV["all-candidates"]
    lp, old, _, adv, mask = tensors(**tensor_set)
    cand, _, _ = candidates(lp, old, adv, mask, ours_kw)
    assert 1 < int(cand.sum()) <= int(0.9 * int(mask.sum()))
    # with the clip bounds swapped (ε_low <-> ε_high) the candidates differ: a flipped bound in the exclusion fails
    for case in ("asymmetric-band", "all-candidates"):
        tensor_set, _, ours_kw = CLIP_COV[case]
        lp, old, _, adv, mask = tensors(**tensor_set)
        swapped = {**ours_kw, "clip_low": ours_kw["clip_high"], "clip_high": ours_kw["clip_low"]}
        assert not torch.equal(candidates(lp, old, adv, mask, ours_kw)[0],
                               candidates(lp, old, adv, mask, swapped)[0]), case


def test_clip_cov_with_rollout_correction_matches_verl():
    """verl multiplies its per-token loss (selected tokens zeroed) by ``rollout_is_weights``; pobench's
    ``rollout_correction`` weights the policy term the same way."""
    lp, old, sampler, adv, mask = tensors(seed=3, noise=0.6)
    weights, _ = compute_rollout_correction_weights(old - sampler, mask, rollout_is="token", rollout_is_threshold="1.5")
    theirs = verl_loss("clip_cov", lp, old, adv, mask, "token-mean", 5, weights=weights, clip_ratio_low=0.2,
                       clip_ratio_high=0.28, clip_cov_ratio=0.05)
    ours = pobench_loss("clip_cov", lp, old, adv, mask, 5, sampler=sampler, clip_low=0.2, clip_high=0.28,
                        clip_cov_frac=0.05, rollout_correction="token-truncate", rollout_correction_cap=1.5)
    for a, b in zip(ours[:2], theirs[:2]):
        torch.testing.assert_close(a, b, **CLOSE)


# ------------------------------------------------------------------------------------------------ KL-Cov
#: case -> (tensor set, verl PolicyLossConfig kwargs, pobench overrides)
KL_COV = {
    "frac-0.1": ({}, {"kl_cov_ratio": 0.1, "ppo_kl_coef": 1.0}, {"kl_cov_frac": 0.1}),
    "far-coef-0.5": ({"seed": 1, "noise": 1.0}, {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5},
                     {"kl_cov_frac": 0.2, "kl_cov_coef": 0.5}),
    "scripts-2e-3": ({"seed": 2}, {"kl_cov_ratio": 2e-3, "ppo_kl_coef": 1.0}, {}),  # our defaults: k = 1 token
    "verl-defaults": ({"seed": 3}, {}, {"kl_cov_frac": 2e-4, "kl_cov_coef": 0.1}),
}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("case", list(KL_COV))
def test_kl_cov_matches_verl(case, agg):
    tensor_set, theirs_kw, ours_kw = KL_COV[case]
    lp, old, _, adv, mask = tensors(**tensor_set)
    their_loss, their_grad, _ = verl_loss("kl_cov", lp, old, adv, mask, agg, 0, **theirs_kw)
    our_loss, our_grad, _ = pobench_loss("kl_cov", lp, old, adv, mask, 0, aggregation=agg, **ours_kw)
    torch.testing.assert_close(our_loss, their_loss, **CLOSE)
    torch.testing.assert_close(our_grad, their_grad, **CLOSE)


def test_kl_cov_penalty_acts_in_these_cases():
    """The |lp − old| penalty changes verl's loss in every case (a parity of the bare −r·Â would not be KL-Cov's)."""
    for case, (tensor_set, theirs_kw, _) in KL_COV.items():
        lp, old, _, adv, mask = tensors(**tensor_set)
        with_penalty = verl_loss("kl_cov", lp, old, adv, mask, "token-mean", 0, **theirs_kw)[0]
        bare = ((-(lp - old).exp() * adv[:, None]) * mask).sum() / mask.sum()
        assert abs(with_penalty - bare) > 1e-6, case


def test_kl_cov_with_rollout_correction_matches_verl():
    lp, old, sampler, adv, mask = tensors(seed=4, noise=0.6)
    weights, _ = compute_rollout_correction_weights(old - sampler, mask, rollout_is="sequence",
                                                    rollout_is_threshold="2.0")
    theirs = verl_loss("kl_cov", lp, old, adv, mask, "token-mean", 0, weights=weights, kl_cov_ratio=0.1,
                       ppo_kl_coef=1.0)
    ours = pobench_loss("kl_cov", lp, old, adv, mask, 0, sampler=sampler, kl_cov_frac=0.1,
                        rollout_correction="sequence-truncate", rollout_correction_cap=2.0)
    for a, b in zip(ours[:2], theirs[:2]):
        torch.testing.assert_close(a, b, **CLOSE)
