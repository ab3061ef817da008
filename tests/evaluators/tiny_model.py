"""A tiny causal LM folder for evaluation tests: the shipped `builtin:tiny-arith` when present, else a randomly
initialised model of the same architecture saved as an ordinary Hugging Face folder."""

from __future__ import annotations

import torch

from bench.model import BUILTIN_MODELS, build_char_tokenizer, tiny_config


def tiny_model_dir(tmp_path_factory, seed: int = 0) -> str:
    shipped = BUILTIN_MODELS["builtin:tiny-arith"]
    if (shipped / "config.json").exists():
        return str(shipped)
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("tiny-random")
    tok = build_char_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(tiny_config(tok)).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)
