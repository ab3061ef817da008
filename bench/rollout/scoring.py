"""The one scoring pass: per-token log-probs and entropies of given completions under a model.

The training loop scores every rollout batch with this function (with gradient for the current policy, without for
the old / reference policies), and the rollout sampler's own log-probs are checked against it. Sequences are laid out
as left-padded prompts followed by right-padded completions, with position ids counted over real tokens only, exactly
as the Hugging Face rollout sampler lays them out while sampling::

    [pad pad p1 p2 p3 | c1 c2 c3 pad]      attention mask 0 on pads, positions 0.. over the real tokens

Memory: the full-vocabulary logits are never materialised as one (B, T, V) tensor. For architectures whose output
head is a plain linear layer (``CHUNKABLE``), the backbone's last hidden states of the real completion tokens are
gathered and sent through the head in chunks of at most ``chunk_mb`` MiB of float32 logits; with gradient each chunk
runs under activation checkpointing (its logits are recomputed in the backward pass), so only the (N, H) hidden states
are kept between forward and backward. Other architectures (or ``chunk_mb=0``) take the model's own logits.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils.checkpoint import checkpoint

from algorithms.advantages import sum_pi_squared as pi_squared

# model types whose logits are exactly lm_head(last hidden state): no soft-capping or scaling after the head
CHUNKABLE = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"})
DEFAULT_CHUNK_MB = 256.0  # float32 logits per chunk: 441 tokens at Qwen2.5's vocabulary of 151,936


def one_prompt_per_completion(prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[int]]:
    """One prompt per completion: ``prompt_ids`` as given, or P prompts repeated for P*n completions (prompt-major);
    ValueError for no completions, a count that is no multiple, or an empty prompt."""
    if not completion_ids:
        raise ValueError("score: no completions given")
    if len(completion_ids) != len(prompt_ids):
        if not prompt_ids or len(completion_ids) % len(prompt_ids):
            raise ValueError(f"score: {len(completion_ids)} completions is not a multiple of {len(prompt_ids)} prompts")
        n = len(completion_ids) // len(prompt_ids)
        prompt_ids = [p for p in prompt_ids for _ in range(n)]
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("score: every prompt needs at least one token")
    return prompt_ids


def layout(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int = 0,
           device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """Build (input_ids, attention_mask, position_ids, prompt_width, completion_width) for a batch.

    `prompt_ids` has one prompt per completion, or P prompts for P*n completions (prompt-major: completion i belongs
    to prompt i // n, as in ``Rollouts``).
    """
    prompt_ids = one_prompt_per_completion(prompt_ids, completion_ids)
    lp = max(len(p) for p in prompt_ids)
    lc = max(1, max(len(c) for c in completion_ids))
    b = len(completion_ids)
    ids = torch.full((b, lp + lc), pad_id, dtype=torch.long)  # (B, Lp+T)
    mask = torch.zeros((b, lp + lc), dtype=torch.long)         # (B, Lp+T)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        ids[i, lp - len(p):lp] = torch.tensor(p, dtype=torch.long)
        mask[i, lp - len(p):lp] = 1
        if c:
            ids[i, lp:lp + len(c)] = torch.tensor(c, dtype=torch.long)
            mask[i, lp:lp + len(c)] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)             # (B, Lp+T)
    return ids.to(device), mask.to(device), positions.to(device), lp, lc


def token_stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float, sum_pi_squared: bool = False
                ) -> tuple[torch.Tensor, ...]:
    """Log-prob of `targets` and full-vocabulary entropy under softmax(logits / temperature), in float32.

    logits (..., V), targets (...) -> (logprobs (...), entropies (...)); temperature 0 (greedy) counts as 1. With
    ``sum_pi_squared`` a third tensor (...): Σ_v π(v)² of the same temperature-scaled distribution
    (``algorithms.sum_pi_squared``; what the per-token optimal baselines weigh tokens by).
    """
    t = temperature if temperature > 0 else 1.0
    scaled = logits.float() / t                                          # (..., V)
    logp = torch.log_softmax(scaled, dim=-1)                             # (..., V)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)          # (...)
    entropy = -(logp.exp() * logp).sum(-1)                               # (...)
    if sum_pi_squared:
        return chosen, entropy, pi_squared(scaled)
    return chosen, entropy


def score(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0,
          grad: bool = False, pad_id: int = 0, chunk_mb: float = DEFAULT_CHUNK_MB, sum_pi_squared: bool = False
          ) -> tuple[torch.Tensor, ...]:
    """Per-token (logprobs (B,T), entropies (B,T), mask (B,T)) of the completions; zeros where mask is 0. With
    ``sum_pi_squared`` a fourth (B, T) tensor: Σ_v π(v)² of the same distribution at every token (0 on padding).

    Log-probs and entropies are those of softmax(logits / temperature) (temperature 0 counts as 1), in float32.
    `grad` keeps the autograd graph (the current policy); otherwise it runs under ``torch.no_grad``.
    The mask is float32: 1.0 on completion tokens, 0.0 on padding. `chunk_mb` bounds the float32 logits held at once
    (module docstring); 0 computes the (B, T, V) logits in one piece (the reference the chunked path equals).
    `model` may be a ``peft`` model: its adapters apply unless disabled (``model.disable_adapter()``).
    """
    device = next(model.parameters()).device
    ids, attn, pos, lp, lc = layout(prompt_ids, completion_ids, pad_id=pad_id, device=device)
    parts = _backbone_and_head(model) if chunk_mb > 0 else None
    with torch.set_grad_enabled(grad):
        targets = ids[:, lp:]                                            # (B, T)
        mask = attn[:, lp:].to(torch.float32)                            # (B, T)
        if parts is None:
            # logits of the last lc+1 positions: those at lp-1 .. lp+lc-2 predict completion tokens 0 .. lc-1
            out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, logits_to_keep=lc + 1)
            logits = out.logits[:, :-1, :]                               # (B, T, V)
            stats = token_stats(logits, targets, temperature, sum_pi_squared)  # (B, T) each
            return (*(x * mask for x in stats[:2]), mask, *(x * mask for x in stats[2:]))
        backbone, head = parts
        hidden = backbone(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
        stats = head_stats(head, hidden[:, lp - 1:-1, :], targets, mask, temperature, chunk_mb, sum_pi_squared)
    return (*stats[:2], mask, *stats[2:])


def head_stats(head, hidden: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, temperature: float,
               chunk_mb: float, sum_pi_squared: bool = False) -> tuple[torch.Tensor, ...]:
    """(logprobs (B, T), entropies (B, T)) of ``targets`` from the hidden states that predict them (B, T, H), through
    the output head in chunks of at most ``chunk_mb`` MiB of float32 logits (real tokens only: zeros where mask is 0);
    with gradient each chunk is recomputed in the backward pass (module docstring). With ``sum_pi_squared`` a third
    (B, T) tensor, Σ_v π(v)² (``token_stats``)."""
    real = mask.bool()                                                   # (B, T)
    h = hidden[real]                                                     # (N, H): states predicting real tokens
    y = targets[real]                                                    # (N,)
    rows = max(1, int(chunk_mb * 2**20) // (4 * head.out_features))
    chunks = []
    for s in range(0, h.shape[0], rows):
        if torch.is_grad_enabled() and h.requires_grad:
            chunks.append(checkpoint(_head_stats, head, h[s:s + rows], y[s:s + rows], temperature, sum_pi_squared,
                                     use_reentrant=False))
        else:
            chunks.append(_head_stats(head, h[s:s + rows], y[s:s + rows], temperature, sum_pi_squared))
    where = real.nonzero(as_tuple=True)
    zeros = torch.zeros_like(mask)
    n_out = 3 if sum_pi_squared else 2
    if not chunks:  # no real token at all
        return tuple(zeros.clone() for _ in range(n_out))
    return tuple(zeros.index_put(where, torch.cat([c[k] for c in chunks])) for k in range(n_out))  # (B, T) each


def _head_stats(head, h: torch.Tensor, y: torch.Tensor, temperature: float, sum_pi_squared: bool = False
                ) -> tuple[torch.Tensor, ...]:
    """Chosen-token log-probs and entropies (and Σπ²) of one chunk: h (n, H), y (n,) -> (n,) each."""
    return token_stats(head(h), y, temperature, sum_pi_squared)


_warned: set[str] = set()


def _backbone_and_head(model):
    """(backbone, lm_head) when logits = lm_head(backbone(...).last_hidden_state) exactly, else None."""
    net = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: the injected model
    kind = getattr(getattr(net, "config", None), "model_type", None)
    head = net.get_output_embeddings() if hasattr(net, "get_output_embeddings") else None
    backbone = net.get_decoder() if hasattr(net, "get_decoder") else None
    if kind in CHUNKABLE and isinstance(head, torch.nn.Linear) and backbone is not None:
        return backbone, head
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(f"scoring: model type {kind!r} is not in bench.rollout.scoring.CHUNKABLE; its (B, T, V) logits "
                      "are computed in one piece", stacklevel=3)
    return None
