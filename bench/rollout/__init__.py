"""The rollout sampler: one `generate` interface for training rollouts and evaluation, with two backends.

``make_sampler("hf", model, tokenizer)`` samples with the Hugging Face model itself (batched, with a KV cache, on CPU
or GPU); it shares the module with the training loop, so ``update_weights`` is a no-op. ``make_sampler("vllm", ...)``
(optional extra ``pobench[vllm]``) samples with vLLM and receives the weights after every optimizer step. Both return
the same ``Rollouts`` and satisfy ``Sampler``.

| module | owns |
|---|---|
| ``types.py`` | ``SamplingParams``, ``Rollouts``, ``encode_prompts``, ``stop_token_ids``: what both samplers share |
| ``hf.py`` | ``HFSampler`` (and ``filter_logits``, its top-k / nucleus filter) |
| ``vllm.py`` | ``VLLMSampler``; imported only when asked for, so vllm stays optional |
| ``scoring.py`` | ``score``: the training loop's one scoring pass (the samplers' log-probs are checked against it) |

The samplers import ``types`` and ``scoring`` only, never each other; ``make_sampler`` (here) is the one place that
picks one.
"""

from __future__ import annotations

from typing import Protocol

from bench.rollout.hf import HFSampler
from bench.rollout.types import Rollouts, SamplingParams, encode_prompts, stop_token_ids

__all__ = ["HFSampler", "Sampler", "Rollouts", "SamplingParams", "encode_prompts", "make_sampler",
           "stop_token_ids"]


class Sampler(Protocol):
    """What the training loop and the evaluation use of a sampler (``HFSampler``, ``VLLMSampler``)."""

    #: "hf" | "vllm"
    backend: str
    #: True when the returned log-probs / entropies are those of the training module's scoring pass, so the training
    #: loop takes the sampling policy's log-probs from the rollout instead of scoring it again
    exact_logprobs: bool

    def generate(self, prompts: list[str], n: int, params: SamplingParams, seed: int) -> Rollouts:
        """`n` completions of every prompt (prompt-major: completion i belongs to prompt i // n)."""
        ...

    def update_weights(self, model) -> None:
        """Called after every optimizer step with the training module (no-op for the HF sampler, which samples with
        the module itself)."""
        ...


def make_sampler(backend: str, model, tokenizer, **options) -> Sampler:
    """The rollout sampler of `backend` ("hf" | "vllm") for `model` / `tokenizer`."""
    if backend == "hf":
        return HFSampler(model, tokenizer, **options)
    if backend == "vllm":
        from bench.rollout.vllm import VLLMSampler

        return VLLMSampler(model, tokenizer, **options)
    raise ValueError(f"unknown rollout backend {backend!r}; valid: hf, vllm")
