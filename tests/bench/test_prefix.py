"""Shared-prefix scoring (bench/rollout/prefix.py) equals the unshared pass: log-probs, entropies and every parameter
gradient (1e-5, float32), for the built-in model and a randomly initialised Qwen2-architecture model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from bench.model import build_char_tokenizer, load_policy, tiny_config
from bench.rollout.prefix import can_share, distinct_prompts, score_shared
from bench.rollout.scoring import score


def _model(kind: str, attn: str = "sdpa"):
    if kind == "builtin":
        model, _ = load_policy("builtin:tiny-arith")
        model.config._attn_implementation = attn
        return model
    if kind == "qwen2":
        cfg = Qwen2Config(vocab_size=120, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0,
                          eos_token_id=1, bos_token_id=None, tie_word_embeddings=False)
    else:  # the built-in architecture, random weights
        cfg = tiny_config(build_char_tokenizer())
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


def _rows(seed: int = 1):
    """Prompts of different lengths (left padding), each shared by several completions that are NOT adjacent rows,
    completions of different lengths (right padding), one of a single token."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 90, (n,), generator=g).tolist() for n in (5, 11, 2)]
    rows_p, rows_c = [], []
    for k, n in enumerate((4, 7, 1, 12, 3, 8, 6, 9)):
        rows_p.append(prompts[k % 3])
        rows_c.append(torch.randint(3, 90, (n,), generator=g).tolist())
    return rows_p, rows_c


def _pass(fn, model, prompts, comps, temperature, chunk_mb):
    model.zero_grad(set_to_none=True)
    lp, ent, mask = fn(model, prompts, comps, temperature, grad=True, chunk_mb=chunk_mb)
    w = torch.linspace(0.5, 1.5, lp.numel()).view_as(lp)  # distinct weights per token: a misplaced token shows
    (((lp * w).sum() + (ent * w.flip(-1)).sum()) / mask.sum()).backward()  # a mean, as a loss: gradients ~1
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), mask, grads


def _assert_same(a, b):
    assert torch.equal(a[2], b[2])
    torch.testing.assert_close(b[0], a[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b[1], a[1], atol=1e-5, rtol=1e-5)
    assert set(a[3]) == set(b[3]) and a[3]
    for n, g in a[3].items():
        torch.testing.assert_close(b[3][n], g, atol=1e-5, rtol=1e-5, msg=n)


@pytest.mark.parametrize("kind", ["builtin", "llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("chunk_mb", [0.0, 256.0])
def test_shared_prefix_equals_the_unshared_pass_with_gradients(kind, attn, chunk_mb):
    model = _model(kind, attn)
    prompts, comps = _rows()
    _assert_same(_pass(score, model, prompts, comps, 0.8, chunk_mb),
                 _pass(score_shared, model, prompts, comps, 0.8, chunk_mb))


def test_shared_prefix_without_gradient_and_prompt_major_rows():
    model = _model("qwen2")
    prompts, comps = _rows(2)
    distinct = [prompts[0], prompts[1]]
    comps = comps[:6]  # 2 prompts x 3 completions, prompt-major as Rollouts gives them
    full = [p for p in distinct for _ in range(3)]
    lp0, ent0, m0 = score(model, full, comps)
    lp1, ent1, m1 = score_shared(model, distinct, comps)
    assert not lp1.requires_grad and torch.equal(m0, m1)
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=1e-5)


def test_the_gradient_reaches_the_prompt_positions_once_per_completion():
    """A loss on the completions of ONE prompt: its positions' gradient is the sum over its completions (an
    embedding row used only by that prompt gets exactly the unshared gradient)."""
    model = _model("llama")
    prompts, comps = _rows(3)
    a = _pass(score, model, prompts, comps, 1.0, 256.0)
    b = _pass(score_shared, model, prompts, comps, 1.0, 256.0)
    emb = "model.embed_tokens.weight"
    only_prompt = [t for t in set(prompts[1]) if all(t not in c for c in comps) and t not in prompts[0] + prompts[2]]
    assert only_prompt and b[3][emb][only_prompt].abs().sum() > 0
    torch.testing.assert_close(b[3][emb][only_prompt], a[3][emb][only_prompt], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("chunk_mb", [0.0, 256.0])
def test_lora_adapter_gradients_are_the_same(chunk_mb):
    from bench.engines.native.scale import apply_lora

    model = apply_lora(_model("qwen2"), 4, 8.0, ["q_proj", "v_proj", "down_proj"])
    with torch.no_grad():  # a non-zero adapter (peft initialises B = 0)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
    prompts, comps = _rows()
    a, b = (_pass(fn, model, prompts, comps, 1.0, chunk_mb) for fn in (score, score_shared))
    assert all("lora_" in n for n in a[3])
    _assert_same(a, b)


def test_activation_checkpointing_with_gradient_falls_back_to_the_unshared_pass():
    from bench.engines.native.scale import enable_activation_checkpointing

    model = _model("qwen2")
    enable_activation_checkpointing(model)
    assert not can_share(model, grad=True) and can_share(model, grad=False)
    prompts, comps = _rows()
    _assert_same(_pass(score, model, prompts, comps, 1.0, 256.0), _pass(score_shared, model, prompts, comps, 1.0,
                                                                          256.0))


def test_distinct_prompts_in_order_of_first_appearance():
    assert distinct_prompts([[1, 2], [3], [1, 2], [3], [4]]) == ([[1, 2], [3], [4]], [0, 1, 0, 1, 2])


@pytest.mark.parametrize("chunk_mb", [0.0, 256.0])
def test_shared_prefix_sum_pi_squared_equals_the_unshared_pass(chunk_mb):
    model = _model("qwen2")
    prompts, comps = _rows(3)
    a = score(model, prompts, comps, 0.8, chunk_mb=chunk_mb, sum_pi_squared=True)
    b = score_shared(model, prompts, comps, 0.8, chunk_mb=chunk_mb, sum_pi_squared=True)
    assert len(a) == len(b) == 4 and torch.equal(a[2], b[2])
    for x, y in zip(a, b):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-5)
    assert (a[3] > 0).sum() == a[2].sum()  # Σπ² > 0 on every completion token, 0 on padding
