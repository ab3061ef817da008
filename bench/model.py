"""The policy: the built-in tiny character-level model, loading any causal LM, and prompt formatting.

The built-in policy ``builtin:tiny-arith`` is a ~0.87M-parameter Llama-architecture causal LM with a character-level
tokenizer saved as a ``PreTrainedTokenizerFast``; its folder (``bench/assets/tiny-arith/``) is an ordinary Hugging Face
model folder that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load like any hub model. It is warm-started on the
`arith` task by ``bench/warmstart.py`` (see docs/MODEL.md). Any other policy is a local folder or a hub id.
"""

from __future__ import annotations

import string
import sys
from pathlib import Path

import torch

from bench.inputs import prompt_template_refusal

ASSETS = Path(__file__).resolve().parent / "assets"
# tiny-arith: the warm-start recipe's 500 steps (docs/MODEL.md); tiny-arith-425: its first 425 steps, the uncertain
# starting policy of the `headroom` preset (docs/TESTBED.md): the same weights as `bench warmstart --steps 425`
BUILTIN_MODELS = {"builtin:tiny-arith": ASSETS / "tiny-arith", "builtin:tiny-arith-425": ASSETS / "tiny-arith-425"}

PLAIN_TEMPLATE = "Q: {question}\nA:"
PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
# the character vocabulary: 3 special tokens, then newline, space and printable ASCII
CHARS = ["\n", " "] + [c for c in string.printable if c not in string.whitespace]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_char_tokenizer(model_max_length: int = 256):
    """A character-level ``PreTrainedTokenizerFast``: one token per character, eos and pad tokens, left padding."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK] + CHARS)}
    # BPE without merges = one token per character; characters outside the vocabulary become <unk>.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.decoder = decoders.Fuse()  # concatenate characters (no spaces between tokens)
    core.add_special_tokens([PAD, EOS, UNK])
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, pad_token=PAD, unk_token=UNK,
                                   padding_side="left", model_max_length=model_max_length,
                                   clean_up_tokenization_spaces=False)


def tiny_config(tokenizer, *, hidden_size: int = 128, layers: int = 4, heads: int = 4, intermediate_size: int = 384,
                max_positions: int = 256):
    """The built-in architecture: a 4-layer Llama (d=128, MLP 384, tied embeddings), ~0.87M parameters.

    Llama rather than Qwen2 (the same block minus q/k/v biases) because transformers 5 loads a Qwen2 folder's tokenizer
    as ``Qwen2Tokenizer`` whatever ``tokenizer_config.json`` says, which breaks the character tokenizer.
    """
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                       max_position_embeddings=max_positions, tie_word_embeddings=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                       bos_token_id=None, attention_bias=False, mlp_bias=False)


def resolve_device(device: str = "auto") -> torch.device:
    """`auto` -> cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use --device cpu")
    return torch.device(device)


def resolve_model_path(name_or_path: str) -> str:
    """`builtin:NAME` -> the shipped folder; a local folder as is; anything else is passed on as a hub id."""
    if name_or_path.startswith("builtin:"):
        if name_or_path not in BUILTIN_MODELS:
            raise ValueError(f"unknown built-in model {name_or_path!r}; valid: {', '.join(BUILTIN_MODELS)}")
        path = BUILTIN_MODELS[name_or_path]
        if not (path / "config.json").exists():
            steps = path.name.rpartition("-")[2] if path.name != "tiny-arith" else "500"
            raise FileNotFoundError(f"the shipped checkpoint of {name_or_path} is missing at {path}; "
                                    f"rebuild it with `bench warmstart --steps {steps} --out {path}`")
        return str(path)
    if name_or_path.startswith(("/", "./", "../", "~")) and not Path(name_or_path).expanduser().exists():
        raise FileNotFoundError(f"model folder {name_or_path!r} does not exist")
    if Path(name_or_path).expanduser().is_dir() and not (Path(name_or_path).expanduser() / "config.json").exists():
        raise FileNotFoundError(f"cannot load model {name_or_path!r}: the folder has no config.json")
    return str(Path(name_or_path).expanduser()) if name_or_path.startswith("~") else name_or_path


def load_policy(name_or_path: str, device: str = "cpu", dtype: str = "float32", revision: str | None = None):
    """Load (model, tokenizer) of a causal LM: `builtin:tiny-arith`, a local folder or a hub id.

    The tokenizer pads on the left (generation); a tokenizer without a pad token gets its eos token as pad.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; valid: {', '.join(DTYPES)}")
    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], revision=revision)
    except OSError as e:  # not a folder and not reachable on the hub
        raise FileNotFoundError(f"cannot load model {name_or_path!r}: not a local model folder and not "
                                f"available from the Hugging Face hub ({e.__class__.__name__}: {e})") from e
    if tokenizer.eos_token_id is None:
        raise ValueError(f"model {name_or_path!r}: its tokenizer has no eos token, so completions cannot stop")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.to(resolve_device(device))
    model.eval()
    return model, tokenizer


def format_string(template: str) -> str:
    """The format string of a prompt template that is not ``auto`` / ``chat``: ``plain`` or the user's own, which
    must hold ``{question}``."""
    if template == "plain":
        return PLAIN_TEMPLATE
    why = prompt_template_refusal(template)  # (refused before any work where the flags are checked)
    if why:
        raise ValueError(f"prompt template {template!r}: {why}")
    return template


def format_prompt(tokenizer, question: str, template: str = "auto") -> str:
    """The prompt text for one question.

    `auto`: the tokenizer's chat template when it has one, else the plain template ``"Q: {question}\\nA:"``;
    `chat`: the chat template (error when there is none); `plain`: the plain template; any other string must contain
    ``{question}``, which is replaced by the question (other braces are left alone).
    """
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if template == "auto":
        template = "chat" if has_chat else "plain"
    if template == "chat":
        if not has_chat:
            raise ValueError("prompt template `chat` requested but the tokenizer has no chat template; "
                             "use `plain` or a format string with {question}")
        return tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
    return format_string(template).replace("{question}", question)


def count_parameters(model) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def unknown_characters(tokenizer, texts: list[str]) -> tuple[int, str, str]:
    """(how many of ``texts`` hold a character the tokenizer can only encode as its unknown token, one such character,
    one such text). (0, "", "") for tokenizers without an unknown token (byte-level BPE encodes everything)."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return 0, "", ""
    chars = sorted({c for t in texts for c in t})
    bad = {c for c in chars if unk in tokenizer(c, add_special_tokens=False)["input_ids"]}
    hits = [t for t in texts if bad.intersection(t)]
    if not hits:
        return 0, "", ""
    return len(hits), next(c for c in hits[0] if c in bad), hits[0]


def warn_unknown_characters(tokenizer, texts: list[str], what: str) -> int:
    """Print one warning line when some ``texts`` hold characters the tokenizer does not know; returns the count."""
    n, char, text = unknown_characters(tokenizer, texts)
    if n:
        short = text if len(text) <= 60 else text[:57] + "..."
        print(f"bench: warning: {n} of {len(texts)} {what} contain characters the tokenizer does not know (they "
              f"become {tokenizer.unk_token}, so the model cannot read them), e.g. {char!r} in {short!r}",
              file=sys.stderr)
    return n


def model_shape(model: str) -> dict | None:
    """The config.json of a built-in or local model folder (None for a hub id or a folder without a readable one:
    nothing is downloaded or loaded here). A multimodal config's ``text_config`` stands in for it."""
    import json

    try:
        data = json.loads((Path(resolve_model_path(model)) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("text_config"), dict) and "hidden_size" not in data:
        data = data["text_config"]
    return data if isinstance(data, dict) else None
