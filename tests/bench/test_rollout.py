"""The Hugging Face rollout engine and the scoring pass: log-prob agreement, determinism, shapes, finish reasons."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.model import build_char_tokenizer, format_prompt, load_policy, tiny_config
from bench.rollout import SamplingParams, make_sampler
from bench.rollout.scoring import score
from evaluators.arith import ArithTask

PROMPTS = ["Q: Ann has 12 pens.\nA:", "Q: hi\nA:", "Q: Bob has 3 books. He gets 4 more. How many books now?\nA:"]


@pytest.fixture(scope="module")
def random_policy():
    """A randomly initialised tiny model: rarely emits eos, so completions run to the length limit."""
    tok = build_char_tokenizer()
    g = torch.random.fork_rng()
    with g:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config(tok)).eval()
    return model, tok


@pytest.fixture(scope="module")
def trained_policy():
    return load_policy("builtin:tiny-arith")


def _max_diff(rollouts, logprobs, entropies, mask):
    worst = 0.0
    for i, (lp, ent) in enumerate(zip(rollouts.logprobs, rollouts.entropies)):
        t = len(lp)
        assert mask[i, :t].sum() == t and mask[i, t:].sum() == 0
        worst = max(worst, (logprobs[i, :t] - torch.tensor(lp)).abs().max().item(),
                    (entropies[i, :t] - torch.tensor(ent)).abs().max().item())
    return worst


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=24),
                                    SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9, top_k=20),
                                    SamplingParams(max_new_tokens=24, temperature=0)])
@pytest.mark.parametrize("which", ["random_policy", "trained_policy"])
def test_engine_logprobs_match_the_scoring_pass(which, params, request):
    model, tok = request.getfixturevalue(which)
    prompts = PROMPTS if which == "random_policy" else [format_prompt(tok, p.question)
                                                        for p in ArithTask(3).test_set(6)]
    r = make_sampler("hf", model, tok).generate(prompts, 4, params, seed=3)
    lp, ent, mask = score(model, r.prompt_ids, r.completion_ids, temperature=params.temperature)
    assert lp.shape == ent.shape == mask.shape == (len(prompts) * 4, max(map(len, r.completion_ids)))
    assert _max_diff(r, lp, ent, mask) < 1e-4


def test_sampling_is_deterministic_for_a_seed_and_leaves_global_rng_alone(random_policy):
    model, tok = random_policy
    engine = make_sampler("hf", model, tok)
    params = SamplingParams(max_new_tokens=16)
    state = torch.get_rng_state()
    a = engine.generate(PROMPTS, 3, params, seed=11)
    assert torch.equal(state, torch.get_rng_state())
    b = engine.generate(PROMPTS, 3, params, seed=11)
    c = engine.generate(PROMPTS, 3, params, seed=12)
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    assert a.completion_ids != c.completion_ids


def test_rollout_shapes_and_length_finish(random_policy):
    model, tok = random_policy
    r = make_sampler("hf", model, tok).generate(PROMPTS, 5, SamplingParams(max_new_tokens=12), seed=0)
    assert r.n == 5 and len(r.prompt_ids) == 3 and len(r) == 15
    assert r.prompt_ids[2] == tok(PROMPTS[2])["input_ids"]
    for ids, lp, ent, fin, text in zip(r.completion_ids, r.logprobs, r.entropies, r.finish_reasons, r.texts):
        assert len(ids) == len(lp) == len(ent)
        assert (fin == "stop") == (ids[-1] == tok.eos_token_id)
        assert fin == "stop" or len(ids) == 12
        assert all(x <= 0 for x in lp) and all(e >= 0 for e in ent)
        assert text == tok.decode(ids, skip_special_tokens=True)


def test_greedy_chunking_and_top_k_one(random_policy):
    model, tok = random_policy
    greedy = SamplingParams(max_new_tokens=10, temperature=0)
    full = make_sampler("hf", model, tok).generate(PROMPTS, 2, greedy, seed=0)
    chunked = make_sampler("hf", model, tok, max_batch_size=2).generate(PROMPTS, 2, greedy, seed=5)
    assert full.completion_ids == chunked.completion_ids
    assert full.completion_ids[0] == full.completion_ids[1]  # greedy: the n copies agree
    top1 = make_sampler("hf", model, tok).generate(PROMPTS, 2, SamplingParams(max_new_tokens=10, top_k=1), seed=9)
    assert top1.completion_ids == full.completion_ids
    # an unbatched prompt gives the same greedy completion as inside a left-padded batch
    alone = make_sampler("hf", model, tok).generate(PROMPTS[1:2], 1, greedy, seed=0)
    assert alone.completion_ids[0] == full.completion_ids[2]


def test_trained_model_stops_at_eos(trained_policy):
    model, tok = trained_policy
    prompts = [format_prompt(tok, p.question) for p in ArithTask(2).test_set(8)]
    r = make_sampler("hf", model, tok).generate(prompts, 2, SamplingParams(max_new_tokens=48), seed=0)
    assert r.finish_reasons.count("stop") >= 14
    for ids, fin, text in zip(r.completion_ids, r.finish_reasons, r.texts):
        if fin == "stop":
            assert ids[-1] == tok.eos_token_id and tok.eos_token_id not in ids[:-1]
            assert "####" in text and "<eos>" not in text


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=48), SamplingParams(max_new_tokens=48, top_p=0.9),
                                    SamplingParams(max_new_tokens=48, temperature=0)])
def test_dropping_finished_rows_gives_the_same_rollouts(trained_policy, params):
    """Completions that stopped leave the decoding batch: every row, token, log-prob and entropy stays the same."""
    model, tok = trained_policy
    from bench.rollout.hf import HFSampler

    prompts = [format_prompt(tok, p.question) for p in ArithTask(3).test_set(6)]
    kept = HFSampler(model, tok, drop_finished=False).generate(prompts, 8, params, seed=4)
    dropped = HFSampler(model, tok).generate(prompts, 8, params, seed=4)
    lengths = sorted(len(c) for c in kept.completion_ids)
    assert lengths[0] < lengths[len(lengths) // 2] < lengths[-1]  # rows stop at many different steps
    assert dropped.completion_ids == kept.completion_ids and dropped.finish_reasons == kept.finish_reasons
    for a, b in zip(kept.logprobs + kept.entropies, dropped.logprobs + dropped.entropies):
        assert max((abs(x - y) for x, y in zip(a, b)), default=0.0) < 1e-5


def test_scoring_is_padding_invariant_and_differentiable(random_policy):
    model, tok = random_policy
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    comps = [[5, 6, 7], [8], [9, 10, 11, 12, 1]]
    lp, ent, mask = score(model, prompts, comps, temperature=1.0)
    lp1, ent1, _ = score(model, prompts[1:2], comps[1:2], temperature=1.0)
    assert torch.allclose(lp[1, :1], lp1[0, :1], atol=1e-5) and torch.allclose(ent[1, :1], ent1[0, :1], atol=1e-5)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert (lp[mask == 0] == 0).all()
    # P prompts with n completions each (prompt-major) is the same as one prompt per completion
    lp_rep, _, _ = score(model, prompts[:1], [[5, 6], [7]], temperature=1.0)
    lp_exp, _, _ = score(model, [prompts[0], prompts[0]], [[5, 6], [7]], temperature=1.0)
    assert torch.equal(lp_rep, lp_exp)
    lp_g, ent_g, mask_g = score(model, prompts, comps, temperature=0.8, grad=True)
    ((lp_g * mask_g).sum() + ent_g.sum()).backward()
    assert model.model.embed_tokens.weight.grad is not None
    model.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="multiple"):
        score(model, prompts[:2], comps)


def test_bad_input_is_refused(random_policy):
    model, tok = random_policy
    engine = make_sampler("hf", model, tok)
    with pytest.raises(ValueError, match="backend"):
        make_sampler("onnx", model, tok)
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(PROMPTS, 1, SamplingParams(top_p=0), seed=0)
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(PROMPTS, 1, SamplingParams(temperature=-1), seed=0)
    with pytest.raises(ValueError, match="n="):
        engine.generate(PROMPTS, 0, SamplingParams(), seed=0)
    with pytest.raises(ValueError, match="no prompts"):
        engine.generate([], 1, SamplingParams(), seed=0)
