"""What both rollout samplers share: the sampling parameters, the ``Rollouts`` they return, and how prompts are
encoded and where a completion stops.

The samplers (``bench/rollout/hf.py``, ``bench/rollout/vllm.py``) import this module, never each other; the factory
``make_sampler`` that picks one lives in ``bench/rollout/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """How completions are sampled."""

    max_new_tokens: int = 48
    temperature: float = 1.0      # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                # 0 = off

    def validate(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens={self.max_new_tokens!r}: must be an integer >= 1")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature={self.temperature!r}: must be >= 0 (0 = greedy)")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"SamplingParams.top_p={self.top_p!r}: must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k={self.top_k!r}: must be an integer >= 0 (0 = off)")


def check_request(params: SamplingParams, n: int) -> None:
    """What every sampler's ``generate`` refuses before sampling: invalid parameters, ``n`` not an integer >= 1."""
    params.validate()
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"generate: n={n!r} must be an integer >= 1")


@dataclass
class Rollouts:
    """Prompt-major: completion i belongs to prompt i // n."""

    prompt_ids: list[list[int]]           # P prompts
    completion_ids: list[list[int]]       # P*n completions; the stop (eos) token is included when finish == "stop"
    logprobs: list[list[float]]           # per completion token, under logits / temperature (1.0 when greedy)
    entropies: list[list[float]]          # full-vocabulary entropy of that same distribution
    finish_reasons: list[str]             # "stop" | "length"
    texts: list[str]                      # decoded completions, special tokens stripped
    n: int
    stats: dict[str, float] = field(default_factory=dict)  # e.g. generated tokens, seconds

    def __len__(self) -> int:
        return len(self.completion_ids)


def stop_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's eos plus any eos ids of the model's generation config."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(extra)
    return sorted(i for i in ids if i is not None)


def encode_prompts(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt; special tokens (e.g. BOS) are added unless the text already starts with BOS."""
    if not prompts:
        raise ValueError("generate: no prompts given")
    out = []
    bos = tokenizer.bos_token
    for p in prompts:
        if not isinstance(p, str):
            raise ValueError(f"generate: prompts must be strings, got {type(p).__name__}")
        ids = tokenizer(p, add_special_tokens=not (bos and p.startswith(bos)))["input_ids"]
        if not ids:
            raise ValueError(f"generate: prompt {p!r} encodes to no tokens")
        out.append(list(ids))
    return out
