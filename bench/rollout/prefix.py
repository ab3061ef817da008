"""Shared-prefix scoring: each distinct prompt of a batch is forwarded once, its KV shared by its completions.

``score_shared`` returns what ``bench.rollout.scoring.score`` returns for the same rows (same layout, same position
ids, log-probs and entropies equal to ~1e-6, and with ``grad`` the same loss gradient for every parameter): the
prompts' positions are computed once per distinct prompt (with gradient when asked), their keys and values are
indexed into one row per completion (the gradient of every completion's attention flows back, summed, into its
prompt's positions), and the completions are forwarded after them like a chunked prefill::

    prompts (U, Lp):      [pad pad p1 p2 p3]          one row per distinct prompt, left-padded
    completions (B, Lc):  [c1 c2 c3 pad] -> attends to its prompt's cached KV, positions continuing after p3

The first completion token is predicted by the prompt's last position (the prompt pass's last hidden state, indexed
per completion); token j > 0 by completion position j − 1. A group of G completions costs U·Lp + B·Lc positions instead
of B·(Lp + Lc): with G = 8 and prompts as long as the completions, 44% of the forward / backward work.

Limits (``can_share``; ``score`` is used instead, giving the same numbers):
- activation checkpointing with gradient: Hugging Face's checkpointed decoder layers drop the KV cache in training
  mode (passes without gradient still share);
- the model must take a ``DynamicCache`` (every Hugging Face causal LM does; tested: the built-in Llama, Qwen2, with
  the ``sdpa`` and ``eager`` attention implementations, and a LoRA adapter; flash-attention and sliding-window
  layers are expected to work the way generation with a cache does, untested here).
"""

from __future__ import annotations

import inspect

import torch

from bench.rollout.scoring import (
    DEFAULT_CHUNK_MB,
    _backbone_and_head,
    head_stats,
    one_prompt_per_completion,
    score,
    token_stats,
)


def distinct_prompts(prompt_ids: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """(the distinct prompts in order of first appearance, the index of each row's prompt among them)."""
    index: dict[tuple[int, ...], int] = {}
    rows = []
    for p in prompt_ids:
        rows.append(index.setdefault(tuple(p), len(index)))
    return [list(p) for p in index], rows


def can_share(model, grad: bool) -> bool:
    """False when a pass with gradient would run under activation checkpointing (Hugging Face then drops the cache)."""
    if not (grad and model.training):
        return True
    return not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def cache_argument(net) -> str:
    """The name under which ``net.forward`` takes the KV cache: ``cache`` (transformers >= 5.2x) or
    ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(net.forward).parameters else "past_key_values"


def score_shared(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0,
                 grad: bool = False, pad_id: int = 0, chunk_mb: float = DEFAULT_CHUNK_MB, sum_pi_squared: bool = False
                 ) -> tuple[torch.Tensor, ...]:
    """``score``'s (logprobs (B, T), entropies (B, T), mask (B, T)) with each distinct prompt forwarded once; with
    ``sum_pi_squared`` also ``score``'s fourth tensor, Σ_v π(v)² per token.

    `prompt_ids` has one prompt per completion (rows of the same prompt need not be adjacent), or P prompts for P*n
    completions (prompt-major, as in ``Rollouts``). Falls back to ``score`` where ``can_share`` says no.
    """
    prompt_ids = one_prompt_per_completion(prompt_ids, completion_ids)
    if not can_share(model, grad):
        return score(model, prompt_ids, completion_ids, temperature, grad=grad, pad_id=pad_id, chunk_mb=chunk_mb,
                     sum_pi_squared=sum_pi_squared)
    from transformers import DynamicCache

    device = next(model.parameters()).device
    prompts, row_of = distinct_prompts(prompt_ids)
    u, b = len(prompts), len(completion_ids)
    lp = max(len(p) for p in prompts)
    lc = max(1, max(len(c) for c in completion_ids))
    p_ids = torch.full((u, lp), pad_id, dtype=torch.long)             # (U, Lp)
    p_attn = torch.zeros((u, lp), dtype=torch.long)                    # (U, Lp)
    for i, p in enumerate(prompts):
        p_ids[i, lp - len(p):] = torch.tensor(p, dtype=torch.long)
        p_attn[i, lp - len(p):] = 1
    c_ids = torch.full((b, lc), pad_id, dtype=torch.long)             # (B, Lc)
    c_attn = torch.zeros((b, lc), dtype=torch.long)                    # (B, Lc)
    for i, c in enumerate(completion_ids):
        if c:
            c_ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
            c_attn[i, :len(c)] = 1
    rows = torch.tensor(row_of, dtype=torch.long, device=device)       # (B,)
    p_ids, p_attn, c_ids, c_attn = (t.to(device) for t in (p_ids, p_attn, c_ids, c_attn))
    attn = torch.cat([p_attn[rows], c_attn], dim=1)                    # (B, Lp+Lc)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)                           # (B, Lp+Lc): as scoring.layout counts them
    p_pos = (p_attn.cumsum(-1) - 1).clamp(min=0)                       # (U, Lp)
    parts = _backbone_and_head(model) if chunk_mb > 0 else None
    net = parts[0] if parts is not None else model
    cache_kw = cache_argument(net.get_base_model() if hasattr(net, "get_base_model") else net)
    mask = c_attn.to(torch.float32)                                    # (B, T)
    with torch.set_grad_enabled(grad):
        config = (model.get_base_model() if hasattr(model, "get_base_model") else model).config
        cache = DynamicCache(config=config)
        extra = {} if parts is not None else {"logits_to_keep": 1}
        first = net(input_ids=p_ids, attention_mask=p_attn, position_ids=p_pos, use_cache=True,
                    **{cache_kw: cache}, **extra)
        if u != b or row_of != list(range(b)):
            cache.batch_select_indices(rows)                           # (B, ...) per layer: gradient sums back
        rest = net(input_ids=c_ids, attention_mask=attn, position_ids=pos[:, lp:], use_cache=True,
                   **{cache_kw: cache})
        if parts is not None:
            head = parts[1]
            pred = torch.cat([first.last_hidden_state[:, -1:][rows], rest.last_hidden_state[:, :-1]], dim=1)
            stats = head_stats(head, pred, c_ids, mask, temperature, chunk_mb, sum_pi_squared)  # (B, T) each
        else:
            logits = torch.cat([first.logits[:, -1:][rows], rest.logits[:, :-1]], dim=1)  # (B, T, V)
            stats = tuple(x * mask for x in token_stats(logits, c_ids, temperature, sum_pi_squared))
    return (*stats[:2], mask, *stats[2:])
