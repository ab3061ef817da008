"""The update's two exact savings (bench/engines/native/step.py): the shared-prefix forward and skipping
zero-advantage sequences give the gradients of the plain computation at every optimizer step, and the metrics keep
their values."""

from __future__ import annotations

import copy

import pytest
import torch

from algorithms import get_objective
from bench.config import TrainConfig
from bench.engines.native.scale import Reference
from bench.engines.native.step import Group, update
from bench.model import format_prompt, load_policy
from bench.rollout import SamplingParams, make_sampler
from tests.bench.record_grads import RecordGrads

VARIANTS = [(False, False), (True, False), (False, True), (True, True)]  # (shared_prefix, skip_zero_advantage)


@pytest.fixture(scope="module")
def rollout():
    """The built-in model and 4 prompts x 4 completions it sampled (with the sampler's log-probs); the advantages of
    groups 0 and 2 are 0 (all-equal rewards), one completion of group 3 too; some completions are flagged truncated
    (the flag is what ``mask_truncated`` reads)."""
    model, tok = load_policy("builtin:tiny-arith")
    sampler = make_sampler("hf", model, tok)
    qs = ["Ann has 3 eggs, finds 4. How many now?", "Max has 15 cards, finds 93. How many now?",
          "Eve has 27 books, finds 3. How many now?", "Cy has 39 coins, gets 70, finds 60. How many now?"]
    ro = sampler.generate([format_prompt(tok, q, "plain") for q in qs], 4, SamplingParams(max_new_tokens=16), seed=3)
    g = torch.Generator().manual_seed(0)
    groups = []
    for p in range(4):
        sl = slice(4 * p, 4 * p + 4)
        adv = torch.zeros(4) if p in (0, 2) else torch.randn(4, generator=g)
        if p == 3:
            adv[1] = 0.0
        groups.append(Group(qs[p], ro.prompt_ids[p], ro.completion_ids[sl], ro.texts[sl], torch.ones(4), torch.ones(4),
                            advantages=adv, logprobs=ro.logprobs[sl], entropies=ro.entropies[sl],
                            truncated=torch.tensor([(p + k) % 3 == 0 for k in range(4)])))
    return model, tok, groups


class InexactSampler:
    """A sampler whose log-probs are not the training module's (as vLLM's): the loop scores π_old itself."""

    exact_logprobs = False

    def update_weights(self, model) -> None:
        pass


def run_update(rollout, algo, overrides, shared, skip, optimizer=None, exact=True, **fields):
    model, tok, groups = rollout
    cfg = TrainConfig(algo=algo, objective_overrides=overrides, max_new_tokens=16, shared_prefix=shared,
                      skip_zero_advantage=skip, max_grad_norm=0.0, **fields)
    opt = optimizer(model) if optimizer else RecordGrads(model.parameters())
    objective = get_objective(algo, **overrides)
    ref = Reference(model) if objective.needs_reference or cfg.track_ref_kl else None
    sampler = make_sampler("hf", model, tok) if exact else InexactSampler()
    out = update(cfg, objective, model, ref, opt, sampler, copy.deepcopy(groups), 1)
    model.zero_grad(set_to_none=True)
    return out, opt


CASES = [
    ("dapo", {}, dict(minibatches=1, micro_batch_size=64)),  # on-policy: skipped rows take the rollout's log-probs
    ("dapo", {}, dict(minibatches=2, micro_batch_size=3)),  # off-policy: skipped rows get a pass without gradient
    ("dapo", {}, dict(minibatches=1, micro_batch_size=64, exact=False)),  # (π_old not from the rollout: a pass)
    ("dapo", {}, dict(minibatches=3, micro_batch_size=4, exact=False)),
    ("grpo", {"kl_coef": 0.0}, dict(minibatches=2, micro_batch_size=4)),
    ("dr_grpo", {"mask_truncated": True}, dict(minibatches=1, micro_batch_size=5)),
    ("dapo", {"mask_truncated": True}, dict(minibatches=1, micro_batch_size=5)),
    ("tepo", {}, dict(minibatches=2, micro_batch_size=64)),
    ("grpo", {}, dict(minibatches=2, micro_batch_size=4)),  # β > 0: nothing skipped, the prefix still shared
    ("kl_cov", {}, dict(minibatches=1, micro_batch_size=64)),  # a selection across the batch: nothing skipped
]


@pytest.mark.parametrize(("algo", "overrides", "fields"), CASES, ids=[f"{a}-{i}" for i, (a, *_) in enumerate(CASES)])
def test_savings_give_the_plain_gradients_and_metrics(rollout, algo, overrides, fields):
    runs = {v: run_update(rollout, algo, overrides, *v, **fields) for v in VARIANTS}
    base_out, base_opt = runs[(False, False)]
    assert len(base_opt.grads) == fields["minibatches"] * fields.get("update_epochs", 1)
    assert all(max(float(g.abs().max()) for g in step) > 1e-3 for step in base_opt.grads)
    for v, (out, opt) in runs.items():
        for step_a, step_b in zip(base_opt.grads, opt.grads, strict=True):
            for a, b in zip(step_a, step_b, strict=True):
                torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=f"{v}")
        torch.testing.assert_close(out["train/loss"], base_out["train/loss"], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(out["train/grad_norm"], base_out["train/grad_norm"], atol=1e-6, rtol=1e-5)
        config = get_objective(algo, **overrides).config
        if config.aggregation == "token-mean" and not config.mask_truncated:
            # every token-level mean keeps its value however the minibatch is split (token weights; with
            # mask_truncated the metrics' micro-batch weights still count the truncated tokens, as before)
            for key in ("objective/clip_frac_low", "objective/clip_frac_high", "objective/ratio_mean",
                        "objective/entropy", "objective/policy_loss", "train/kl_ref", "train/abs_log_ratio"):
                torch.testing.assert_close(out[key], base_out[key], atol=2e-5, rtol=1e-4, msg=f"{v} {key}")
        assert set(out) == set(base_out)


def test_a_minibatch_of_skipped_rows_steps_the_optimizer_on_a_zero_gradient(rollout):
    """AdamW moves the parameters on a zero gradient (momentum): the skip must give it that zero gradient."""
    model = rollout[0]
    start = copy.deepcopy(model.state_dict())
    after = {}
    for skip in (False, True):
        model.load_state_dict(start)
        run_update(rollout, "dapo", {}, True, skip, optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
                   minibatches=16, micro_batch_size=1)  # one completion per minibatch: some hold only Â = 0
        after[skip] = copy.deepcopy(model.state_dict())
    model.load_state_dict(start)
    for key in start:
        torch.testing.assert_close(after[True][key], after[False][key], atol=1e-6, rtol=1e-5, msg=key)
    assert any(not torch.equal(after[True][k], start[k]) for k in start)


@pytest.mark.parametrize("exact", [True, False])
def test_skipped_rows_metrics_follow_the_policy_across_minibatches(rollout, exact):
    """With a real optimizer the policy moves between minibatches: the skipped rows' metrics must be those of the
    moved policy (a pass without gradient), not of the sampling policy."""
    model = rollout[0]
    start = copy.deepcopy(model.state_dict())
    outs = {}
    for skip in (False, True):
        model.load_state_dict(start)
        outs[skip], _ = run_update(rollout, "dapo", {}, True, skip, exact=exact, minibatches=3, micro_batch_size=64,
                                   update_epochs=2,
                                   optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
    model.load_state_dict(start)
    assert outs[False]["train/abs_log_ratio"] > 1e-3  # the policy moved
    for key in ("train/abs_log_ratio", "train/abs_seq_log_ratio", "objective/ratio_mean", "objective/clip_frac_low",
                "objective/clip_frac_high", "objective/entropy", "train/loss", "train/grad_norm"):
        # float32 rounding of the two summation orders, carried through 6 AdamW steps at lr 1e-2, reaches ~1e-4 of
        # the gradient norm on some CPUs (9.6e-5 measured on one); metrics of the wrong policy differ by 1e-2 and more
        torch.testing.assert_close(outs[True][key], outs[False][key], atol=2e-5, rtol=5e-4,
                                   msg=lambda m, key=key: f"{key}: {m}")
