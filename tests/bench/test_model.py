"""The built-in policy: character tokenizer, architecture, `load_policy` and `format_prompt`."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.model import (
    BUILTIN_MODELS,
    PLAIN_TEMPLATE,
    build_char_tokenizer,
    count_parameters,
    format_prompt,
    load_policy,
    tiny_config,
)

TEXT = "Q: Ann has 12 pens. She gets 34 more. How many pens now?\nA: 12+34=46\n#### 46"


def test_char_tokenizer_round_trips_through_an_ordinary_model_folder(tmp_path):
    tok = build_char_tokenizer()
    ids = tok(TEXT)["input_ids"]
    assert len(ids) == len(TEXT)  # one token per character
    assert tok.eos_token_id is not None and tok.pad_token_id is not None and tok.eos_token_id != tok.pad_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(tok))
    tok.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    # loaded back the way any hub model is loaded (the folder holds the model config too)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    assert tok2(TEXT)["input_ids"] == ids
    assert tok2.decode(ids + [tok2.eos_token_id], skip_special_tokens=True) == TEXT
    assert tok2.padding_side == "left"
    assert tok2("a\u20acb")["input_ids"][1] == tok2.unk_token_id
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path)
    x = torch.tensor([ids])
    assert torch.equal(model(x).logits, model2(x).logits)


def test_tiny_architecture_size():
    tok = build_char_tokenizer()
    model = AutoModelForCausalLM.from_config(tiny_config(tok))
    assert 0.7e6 < count_parameters(model) < 1.0e6
    assert model.config.eos_token_id == tok.eos_token_id


def test_load_policy_bad_names(tmp_path):
    with pytest.raises(ValueError, match="builtin:tiny-arith"):
        load_policy("builtin:nope")
    with pytest.raises(ValueError, match="dtype"):
        load_policy("builtin:tiny-arith", dtype="float8")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_policy(str(tmp_path / "no-such-model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="cannot load model"):
        load_policy(str(tmp_path / "empty"))


def test_load_policy_builtin():
    model, tok = load_policy("builtin:tiny-arith")
    assert str(BUILTIN_MODELS["builtin:tiny-arith"]).endswith("assets/tiny-arith")
    assert tok.eos_token_id == model.config.eos_token_id and tok.padding_side == "left"
    assert not model.training and next(model.parameters()).dtype == torch.float32
    model16, _ = load_policy("builtin:tiny-arith", dtype="bfloat16")
    assert next(model16.parameters()).dtype == torch.bfloat16


def test_format_prompt_templates():
    tok = build_char_tokenizer()
    q = "Ann has 2 {odd} braces."
    assert format_prompt(tok, q) == PLAIN_TEMPLATE.replace("{question}", q)
    assert format_prompt(tok, q, "plain") == f"Q: {q}\nA:"
    assert format_prompt(tok, q, "Problem: {question}\nSolution:") == f"Problem: {q}\nSolution:"
    with pytest.raises(ValueError, match="no chat template"):
        format_prompt(tok, q, "chat")
    with pytest.raises(ValueError, match="question"):
        format_prompt(tok, q, "Problem without a slot")
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}" \
                        "{% if add_generation_prompt %}<assistant>{% endif %}"
    assert format_prompt(tok, q) == f"<user>{q}<assistant>"
    assert format_prompt(tok, q, "plain") == f"Q: {q}\nA:"
