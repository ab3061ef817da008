"""The vLLM rollout backend against the HF backend and the scoring pass (run by `tox -e vllm`, on the CPU build).

Skipped where vllm is not installed. vLLM runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with a small KV cache.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: weights sync without pickling
pytest.importorskip("vllm", reason="vllm is not installed (optional extra `pobench[vllm]`; CPU build: `tox -e vllm`)")

import copy  # noqa: E402
import math  # noqa: E402

import torch  # noqa: E402

from bench.model import format_prompt, load_policy  # noqa: E402
from bench.rollout import SamplingParams, make_sampler  # noqa: E402
from bench.rollout.scoring import score  # noqa: E402

pytestmark = pytest.mark.vllm

QUESTIONS = ["Ann has 12 pens, gets 34. How many now?", "Bob has 50 cards, gets 7, finds 21. How many now?",
             "Zoe has 9 eggs, buys 40, finds 3, gets 18. How many now?", "Max has 77 coins, gets 5. How many now?"]


@pytest.fixture(scope="module")
def setup():
    model, tok = load_policy("builtin:tiny-arith")
    engine = make_sampler("vllm", model, tok, kv_cache_memory_bytes=64 * 2**20)
    prompts = [format_prompt(tok, q) for q in QUESTIONS]
    return model, tok, engine, prompts


def _max_logprob_diff(model, rollouts, temperature):
    lp, _, _ = score(model, rollouts.prompt_ids, rollouts.completion_ids, temperature=temperature)
    return max((lp[i, :len(x)] - torch.tensor(x)).abs().max().item() for i, x in enumerate(rollouts.logprobs))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_logprobs_match_the_scoring_pass(setup, temperature):
    model, tok, engine, prompts = setup
    r = engine.generate(prompts, 4, SamplingParams(max_new_tokens=48, temperature=temperature), seed=0)
    assert len(r.completion_ids) == 16 and r.n == 4 and len(r.prompt_ids) == 4
    assert _max_logprob_diff(model, r, temperature) < 1e-4
    for ids, lp, ent, fin, text in zip(r.completion_ids, r.logprobs, r.entropies, r.finish_reasons, r.texts):
        assert len(ids) == len(lp) == len(ent) and ids
        assert (fin == "stop") == (ids[-1] == tok.eos_token_id)
        assert text == tok.decode(ids, skip_special_tokens=True)
    assert r.finish_reasons.count("stop") >= 12  # the warm-started model ends its answers with eos
    again = engine.generate(prompts, 4, SamplingParams(max_new_tokens=48, temperature=temperature), seed=0)
    assert again.completion_ids == r.completion_ids  # deterministic for a seed


def test_vllm_greedy_rollouts_match_the_hf_backend(setup):
    model, tok, engine, prompts = setup
    params = SamplingParams(max_new_tokens=48, temperature=0)
    v = engine.generate(prompts, 2, params, seed=0)
    h = make_sampler("hf", model, tok).generate(prompts, 2, params, seed=0)
    assert v.completion_ids == h.completion_ids and v.finish_reasons == h.finish_reasons
    assert max(abs(a - b) for x, y in zip(v.logprobs, h.logprobs) for a, b in zip(x, y)) < 1e-4


def test_vllm_follows_the_weights_after_a_sync(setup):
    model, tok, engine, prompts = setup
    params = SamplingParams(max_new_tokens=24, temperature=0)
    before = engine.generate(prompts, 1, params, seed=0)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in changed.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    expected = make_sampler("hf", changed, tok).generate(prompts, 1, params, seed=0)
    assert expected.completion_ids != before.completion_ids  # the perturbation changes the greedy answers
    try:
        engine.update_weights(changed)
        after = engine.generate(prompts, 1, params, seed=0)
        assert after.completion_ids == expected.completion_ids
        sampled = engine.generate(prompts, 2, SamplingParams(max_new_tokens=24), seed=1)
        assert _max_logprob_diff(changed, sampled, 1.0) < 1e-4
    finally:
        engine.update_weights(model)
    assert engine.generate(prompts, 1, params, seed=0).completion_ids == before.completion_ids


def test_rollout_correction_measures_the_vllm_mismatch(setup):
    """vLLM's log-probs against the trainer's scoring pass, through the rollout correction every objective accepts:
    on the CPU build they agree (mismatch ~0, no weight cut); a synthetic shift of the sampler's log-probs is seen."""
    from algorithms import PolicyBatch, get_objective

    model, tok, engine, prompts = setup
    r = engine.generate(prompts, 4, SamplingParams(max_new_tokens=48, temperature=1.0), seed=1)
    lp, _, mask = score(model, [r.prompt_ids[i // r.n] for i in range(len(r))], r.completion_ids, temperature=1.0)
    sampler = torch.zeros_like(lp)
    for i, x in enumerate(r.logprobs):
        sampler[i, :len(x)] = torch.tensor(x)
    adv = torch.linspace(-1, 1, len(r))

    def metrics(s):
        b = PolicyBatch(logprobs=lp.clone().requires_grad_(True), old_logprobs=lp, advantages=adv, mask=mask,
                        max_length=48, sampler_logprobs=s)
        return get_objective("dapo", rollout_correction="token-mask", rollout_correction_cap=2.0).loss(b)[1]

    m = metrics(sampler)
    assert m["objective/mismatch_kl_k3"] < 1e-6 and m["objective/is_cut_frac"] == 0
    m = metrics(sampler - mask)  # the sampler under-states every token by 1 nat: weights e > C = 2 are masked
    assert m["objective/is_cut_frac"] == 1.0 and m["objective/mismatch_kl_k3"] == pytest.approx(math.e - 2, rel=1e-5)
