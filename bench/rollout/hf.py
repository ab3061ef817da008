"""The Hugging Face rollout sampler: sampling with the training module itself, batched, with a KV cache (CPU or GPU).

It shares the module with the training loop, so ``update_weights`` is a no-op. Sampling is deterministic for a seed on
CPU: all randomness comes from one ``torch.Generator`` seeded per call. Sequences are laid out exactly as
``bench.rollout.scoring.score`` lays them out (left-padded prompts, positions counted over real tokens), so its
log-probs match the training loop's scoring pass.
"""

from __future__ import annotations

import inspect
import time

import torch

from bench.rollout.scoring import token_stats
from bench.rollout.types import Rollouts, SamplingParams, check_request, encode_prompts, stop_token_ids


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus to -inf. logits (B, V) -> (B, V)."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]              # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)   # (B, V)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)                # (B, V)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p  # keep the token that crosses top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class HFSampler:
    """Batched sampling with the Hugging Face model itself and a KV cache.

    Options: `max_batch_size` (completions per forward; prompts are chunked so that chunk * n <= it; default: all);
    `drop_finished` (default on): completions that have stopped leave the decoding batch and its KV cache (once an
    eighth of the rows still decoded has stopped), so a step costs the unfinished rows only; the samples are the same
    (every row still draws from the generator, a stopped row's draw is discarded as before).
    """

    backend = "hf"
    #: the log-probs / entropies it returns are those of the training module's scoring pass (to ~1e-5, tested), so
    #: the training loop takes the sampling policy's log-probs from the rollout instead of scoring it again
    exact_logprobs = True

    def __init__(self, model, tokenizer, max_batch_size: int | None = None, drop_finished: bool = True):
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"hf sampler: max_batch_size={max_batch_size!r} must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.drop_finished = drop_finished
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        # transformers >= 5.2x names the KV-cache argument `cache`; older versions `past_key_values`
        net = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model passes **kwargs on
        self.cache_kw = "cache" if "cache" in inspect.signature(net.forward).parameters else "past_key_values"

    def update_weights(self, model) -> None:
        """No-op: this sampler samples with the training module itself."""
        if model is not self.model:
            raise ValueError("hf sampler: update_weights got a different module than the one it samples with")

    def generate(self, prompts: list[str], n: int, params: SamplingParams, seed: int) -> Rollouts:
        """`n` completions of every prompt (prompt-major), deterministic for `seed` on CPU."""
        check_request(params, n)
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        device = next(self.model.parameters()).device
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
        per_chunk = len(prompt_ids) if self.max_batch_size is None else max(1, self.max_batch_size // n)
        out = Rollouts(prompt_ids=prompt_ids, completion_ids=[], logprobs=[], entropies=[], finish_reasons=[],
                       texts=[], n=n)
        was_training = self.model.training
        self.model.eval()
        t0 = time.perf_counter()
        try:
            for start in range(0, len(prompt_ids), per_chunk):
                self._generate_chunk(prompt_ids[start:start + per_chunk], n, params, gen, device, out)
        finally:
            self.model.train(was_training)
        out.texts = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        out.stats = {"seconds": time.perf_counter() - t0,
                     "tokens": float(sum(len(c) for c in out.completion_ids))}
        return out

    @torch.no_grad()
    def _generate_chunk(self, prompt_ids: list[list[int]], n: int, params: SamplingParams, gen: torch.Generator,
                        device: torch.device, out: Rollouts) -> None:
        from transformers import DynamicCache

        p = len(prompt_ids)
        lp = max(len(x) for x in prompt_ids)
        ids = torch.full((p, lp), self.pad_id, dtype=torch.long)   # (P, Lp)
        attn = torch.zeros((p, lp), dtype=torch.long)              # (P, Lp)
        for i, x in enumerate(prompt_ids):
            ids[i, lp - len(x):] = torch.tensor(x, dtype=torch.long)
            attn[i, lp - len(x):] = 1
        ids, attn = ids.to(device), attn.to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)                   # (P, Lp)

        # prefill each prompt once, then repeat its cache for its n completions
        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                            **{self.cache_kw: cache}).logits[:, -1, :]   # (P, V)
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)            # (B, V), B = P*n
            attn = attn.repeat_interleave(n, dim=0)                # (B, Lp)
        b = p * n
        next_pos = pos[:, -1].repeat_interleave(n) + 1             # (B,)
        stop = torch.tensor(self.stop_ids, device=device)
        finished = torch.zeros(b, dtype=torch.bool, device=device)  # (B,)
        rows = torch.arange(b, device=device)                      # (A,): the rows the cache (and attn) still hold
        tokens, lps, ents = [], [], []
        greedy = params.temperature == 0
        for _ in range(params.max_new_tokens):
            scaled = logits.float() / (1.0 if greedy else params.temperature)   # (B, V)
            if greedy:
                tok = scaled.argmax(-1)                                          # (B,)
            else:
                probs = torch.softmax(filter_logits(scaled, params.top_k, params.top_p), dim=-1)
                tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1)     # (B,)
            lp_t, ent_t = token_stats(scaled, tok, 1.0)                          # (B,), (B,)
            tok = torch.where(finished, torch.full_like(tok, self.pad_id), tok)
            tokens.append(tok)
            lps.append(lp_t)
            ents.append(ent_t)
            finished = finished | torch.isin(tok, stop)
            if bool(finished.all()):
                break
            going = ~finished[rows]                                              # (A,)
            if self.drop_finished and int(going.sum()) <= len(rows) * 7 // 8:  # (a cache copy per eighth stopped)
                cache.batch_select_indices(going.nonzero().squeeze(-1))
                rows, attn = rows[going], attn[going]
            attn = torch.cat([attn, torch.ones((len(rows), 1), dtype=attn.dtype, device=device)], dim=-1)
            step = self.model(input_ids=tok[rows, None], attention_mask=attn, position_ids=next_pos[rows, None],
                              use_cache=True, **{self.cache_kw: cache}).logits[:, -1, :]   # (A, V)
            if len(rows) == b:
                logits = step                                                    # (B, V)
            else:  # stopped rows keep their last logits: their draws are discarded
                logits[rows] = step.to(logits.dtype)
            next_pos = next_pos + 1

        tok_m = torch.stack(tokens, dim=1).cpu()    # (B, T)
        lp_m = torch.stack(lps, dim=1).cpu()        # (B, T)
        ent_m = torch.stack(ents, dim=1).cpu()      # (B, T)
        stop_set = set(self.stop_ids)
        for i in range(b):
            row = tok_m[i].tolist()
            length, reason = len(row), "length"
            for j, t in enumerate(row):
                if t in stop_set:
                    length, reason = j + 1, "stop"
                    break
            out.completion_ids.append(row[:length])
            out.logprobs.append(lp_m[i, :length].tolist())
            out.entropies.append(ent_m[i, :length].tolist())
            out.finish_reasons.append(reason)
