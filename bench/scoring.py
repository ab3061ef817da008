"""The one scoring pass: per-token log-probs and entropies of given completions under a model.

The training loop scores every rollout batch with this function (with gradient for the current policy, without for
the old / reference policies), and the rollout engine's own log-probs are checked against it. Sequences are laid out
as left-padded prompts followed by right-padded completions, with position ids counted over real tokens only, exactly
as the Hugging Face rollout engine lays them out while sampling::

    [pad pad p1 p2 p3 | c1 c2 c3 pad]      attention mask 0 on pads, positions 0.. over the real tokens
"""

from __future__ import annotations

import torch


def layout(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int = 0,
           device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """Build (input_ids, attention_mask, position_ids, prompt_width, completion_width) for a batch.

    `prompt_ids` has one prompt per completion, or P prompts for P*n completions (prompt-major: completion i belongs
    to prompt i // n, as in ``Rollouts``).
    """
    if not completion_ids:
        raise ValueError("score: no completions given")
    if len(completion_ids) != len(prompt_ids):
        if not prompt_ids or len(completion_ids) % len(prompt_ids):
            raise ValueError(f"score: {len(completion_ids)} completions is not a multiple of {len(prompt_ids)} prompts")
        n = len(completion_ids) // len(prompt_ids)
        prompt_ids = [p for p in prompt_ids for _ in range(n)]
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("score: every prompt needs at least one token")
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


def token_stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of `targets` and full-vocabulary entropy under softmax(logits / temperature), in float32.

    logits (..., V), targets (...) -> (logprobs (...), entropies (...)); temperature 0 (greedy) counts as 1.
    """
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits.float() / t, dim=-1)                 # (..., V)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)          # (...)
    entropy = -(logp.exp() * logp).sum(-1)                               # (...)
    return chosen, entropy


def score(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0,
          grad: bool = False, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token (logprobs (B,T), entropies (B,T), mask (B,T)) of the completions; zeros where mask is 0.

    Log-probs and entropies are those of softmax(logits / temperature) (temperature 0 counts as 1), in float32.
    `grad` keeps the autograd graph (the current policy); otherwise it runs under ``torch.no_grad``.
    The mask is float32: 1.0 on completion tokens, 0.0 on padding.
    """
    device = next(model.parameters()).device
    ids, attn, pos, lp, lc = layout(prompt_ids, completion_ids, pad_id=pad_id, device=device)
    with torch.set_grad_enabled(grad):
        # logits of the last lc+1 positions: those at lp-1 .. lp+lc-2 predict completion tokens 0 .. lc-1
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, logits_to_keep=lc + 1)
        logits = out.logits[:, :-1, :]                                   # (B, T, V)
        targets = ids[:, lp:]                                            # (B, T)
        logprobs, entropies = token_stats(logits, targets, temperature)  # (B, T), (B, T)
        mask = attn[:, lp:].to(torch.float32)                            # (B, T)
        logprobs = logprobs * mask
        entropies = entropies * mask
    return logprobs, entropies, mask
