"""Chunked scoring: equal to the one-piece (B, T, V) computation (values and gradients), and its peak memory stays
under a derived bound on a model with Qwen2.5's vocabulary."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from bench.rollout.scoring import score
from tests.memtrack import LiveTensorBytes


def _model(vocab: int, hidden: int = 32, layers: int = 2, seed: int = 0, tied: bool = True):
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=tied, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(cfg).eval()


PROMPTS = [[3, 4, 5], [6], [7, 8, 9, 10, 11], [12, 13]]
COMPS = [[20, 21, 22, 23], [24], [25, 26, 27, 28, 29, 30, 1], []]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tied", [True, False])
def test_chunked_scoring_equals_the_one_piece_computation_with_gradients(temperature, tied):
    model = _model(vocab=300, tied=tied)
    V = model.config.vocab_size
    tiny_chunk = 3 * V * 4 / 2**20  # three tokens per chunk: many chunks, one split inside a completion
    grads = {}
    outs = {}
    for name, chunk in (("full", 0), ("chunked", tiny_chunk)):
        model.zero_grad(set_to_none=True)
        lp, ent, mask = score(model, PROMPTS, COMPS, temperature=temperature, grad=True, chunk_mb=chunk)
        w = torch.linspace(0.5, 1.5, lp.numel()).view_as(lp)  # distinct weights per token: wrong placement shows
        ((lp * w).sum() + (ent * w.flip(-1)).sum()).backward()
        outs[name] = (lp.detach(), ent.detach(), mask)
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters()}
    (lp0, ent0, m0), (lp1, ent1, m1) = outs["full"], outs["chunked"]
    assert torch.equal(m0, m1)
    assert (lp1[m1 == 0] == 0).all() and (ent1[m1 == 0] == 0).all()
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=1e-5)
    assert set(grads["full"]) == set(grads["chunked"])
    for n, g in grads["full"].items():
        torch.testing.assert_close(grads["chunked"][n], g, atol=1e-5, rtol=1e-4, msg=n)


def test_chunked_scoring_without_grad_matches_and_keeps_no_graph():
    model = _model(vocab=300)
    lp0, ent0, _ = score(model, PROMPTS, COMPS, chunk_mb=0)
    lp1, ent1, _ = score(model, PROMPTS, COMPS, chunk_mb=5 * 300 * 4 / 2**20)
    assert not lp1.requires_grad and not ent1.requires_grad
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=1e-5)


# --- peak memory -----------------------------------------------------------------------------------------------
# One scoring pass with gradient (forward + backward) of B=2 completions of T=256 tokens after 16-token prompts,
# with Qwen2.5's vocabulary V=151,936 and hidden size H=64 (2 layers, tied embeddings).
# The one-piece path holds the (B, T, V) float32 logits: 2*256*151936*4 B = 297 MiB, and log_softmax, its exp and the
# product for the entropy are tensors of the same size (plus their gradients in backward): several x 297 MiB.
# The chunked path with chunk_mb = C = 8 holds at most, for one chunk (forward, or its recomputation in backward):
# the head's logits, the log-softmax, its exp, the product, and in backward about as many gradient buffers: <= 6 C
# (measured slope: 3.5 C); plus three (V, H) float32 buffers of the tied embedding's gradient (its .grad, the head's
# gradient of the chunk being accumulated, the embedding's dense gradient): 3*V*H*4 B = 111 MiB; plus the backbone's
# activations and the (N, H) hidden states, under 8 MiB here (B*(T+P)*H*4 B = 0.14 MiB per tensor).
# Bound: 6 C + 111 MiB + 8 MiB = 167 MiB, under ONE (B, T, V) float32 tensor (the one-piece path measures ~1.5 GiB).
# Measured as the peak of live tensor storage allocated during the pass (tests/memtrack.py), which does not depend on
# the allocator: the process RSS did (the same pass measured 154 MiB here and 649 MiB on another machine).
B, T, P, V, H, CHUNK_MB = 2, 256, 16, 151_936, 64, 8.0
BOUND_MIB = 6 * CHUNK_MB + 3 * V * H * 4 / 2**20 + 8
FULL_TENSOR_MIB = B * T * V * 4 / 2**20


def _peak_mib(chunk_mb: float) -> tuple[float, bool]:
    """Peak MiB of tensor storage alive during one scoring pass with gradient, and whether its log-probs are finite."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                      tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    model = AutoModelForCausalLM.from_config(cfg)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, V, (B, P), generator=g).tolist()
    comps = torch.randint(2, V, (B, T), generator=g).tolist()
    with LiveTensorBytes() as mem:
        lp, ent, _ = score(model, prompts, comps, grad=True, chunk_mb=chunk_mb)
        (lp.sum() + ent.sum()).backward()
    assert model.get_input_embeddings().weight.grad is not None  # the backward pass ran under the tracker
    return mem.peak / 2**20, bool(torch.isfinite(lp).all())


@pytest.mark.slow
def test_peak_memory_of_a_scoring_pass_with_qwen_vocabulary_stays_under_the_bound():
    assert BOUND_MIB < FULL_TENSOR_MIB
    chunked, finite = _peak_mib(CHUNK_MB)
    assert finite
    assert chunked < BOUND_MIB, chunked
    # control: the same measurement sees the one-piece (B, T, V) logits, so the bound above is not vacuous
    full, _ = _peak_mib(0)
    assert full > 3 * FULL_TENSOR_MIB, full


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_mb", [0.0, 3 * 300 * 4 / 2**20])
def test_sum_pi_squared_is_that_of_the_temperature_scaled_logits(temperature, chunk_mb):
    """``sum_pi_squared=True``: a fourth (B, T) tensor, Σ_v softmax(z / τ)_v² at every completion token from the
    model's own logits (computed here in one piece), 0 on padding; the other three outputs unchanged."""
    from algorithms import sum_pi_squared

    model = _model(vocab=300)
    lp, ent, mask, s2 = score(model, PROMPTS, COMPS, temperature=temperature, chunk_mb=chunk_mb, sum_pi_squared=True)
    lp0, ent0, mask0 = score(model, PROMPTS, COMPS, temperature=temperature, chunk_mb=chunk_mb)
    assert torch.equal(mask, mask0) and torch.equal(lp, lp0) and torch.equal(ent, ent0)
    for i, (p, c) in enumerate(zip(PROMPTS, COMPS)):
        if not c:
            assert (s2[i] == 0).all()
            continue
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:-1].float()  # predict c
        want = sum_pi_squared(logits / temperature)
        torch.testing.assert_close(s2[i, :len(c)], want, atol=1e-5, rtol=1e-5)
        assert (s2[i, len(c):] == 0).all()
