"""Typed user input, checked before any work starts, each problem one line naming its cause.

- :func:`coerce`: a config value to its field's declared type (``TrainConfig`` fields, objective overrides): numbers
  written as text (``lr: 1e-5``, which YAML 1.1 reads as a string) become numbers; booleans come only from real
  booleans or the words true/false, yes/no, on/off (``steps: true`` and ``skip_bad_rows: "no"`` are not guessed at);
  anything else is a ValueError naming the field, the value and the expected type.
- :func:`typed_overrides`: an objective's overrides (``objective_overrides``, ``--params``) checked against the types
  of its config fields.
- :func:`read_yaml`: a YAML file (``--config``, ``--params``): a folder, a binary file or invalid YAML is one line with
  the file, line and column.
- :func:`yaml_flag`: the value of a mapping / list flag (``--objective-overrides '{kl_coef: 0.1}'``): YAML flow syntax
  (JSON is a subset of it).
- :func:`check_seed`: a seed in the range every random generator pobench feeds accepts, naming the flag.
- :func:`prompt_template_refusal`: why a prompt template is none (``auto``, ``chat``, ``plain`` or a format string
  holding ``{question}``): the one rule, which ``bench.model.format_string`` applies when it formats.
- :func:`check_tracking_scheme`: a tracking URI whose scheme MLflow has a store for.
"""

from __future__ import annotations

import argparse
import math
import os
import types
import typing
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from evaluators.hints import NOT_REGULAR, missing_file, not_regular

#: seeds are 32-bit: numpy (Optuna's samplers) refuses more, torch takes them all
SEED_MAX = 2**32 - 1
#: held-out problems per evaluation (--eval-problems): more than any benchmark's test split holds (GSM8K 1,319, MATH
#: 5,000), and an evaluation of that many takes hours; held-out round 11 (H01): 10^11 built its problem set for minutes
EVAL_PROBLEMS_MAX = 1_000_000
_TRUE, _FALSE = ("true", "yes", "on"), ("false", "no", "off")


def _expected(hint: Any, item: type | None = None) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [h for h in typing.get_args(hint) if h is not type(None)]
        return " or ".join(_expected(h) for h in inner) + " or null"
    return {bool: "true or false", int: "an integer", float: "a number (e.g. 0.5 or 1e-5)", str: "a string",
            dict: "a mapping of name: value",
            list: f"a list of {'numbers' if item is float else 'strings' if item is str else 'values'}"}.get(
        hint, getattr(hint, "__name__", str(hint)))


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a number or a number written as text; None otherwise (booleans included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().replace("_", ""))
        except ValueError:
            return None
    return None


def coerce(name: str, value: Any, hint: Any, item: type | None = None, where: str = "config field") -> Any:
    """``value`` converted to the type ``hint`` (bool, int, float, str, dict, list, or ``X | None``); ValueError
    ``<where> `name`=value: expected ...`` when it is not one. ``item``: the element type of a list."""
    declared = hint

    def bad(extra: str = "") -> ValueError:
        return ValueError(f"{where} `{name}`={value!r}: expected {_expected(declared, item)}{extra}")

    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        inner = [h for h in typing.get_args(hint) if h is not type(None)]
        hint = inner[0] if len(inner) == 1 else hint
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise bad()
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        number = _number(value)
        if number is not None and math.isfinite(number) and number == int(number):
            return int(number)
        raise bad(" (true / false are not numbers)" if isinstance(value, bool) else "")
    if hint is float:
        if isinstance(value, float):
            return value
        number = _number(value)
        if number is None:
            raise bad(" (true / false are not numbers)" if isinstance(value, bool) else "")
        return number
    if hint is str:
        if isinstance(value, str):
            return value
        raise bad(" (quote it to mean the text)" if isinstance(value, (int, float, bool)) else "")
    if hint is dict or typing.get_origin(hint) is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise bad()
        return dict(value)
    if hint is list or typing.get_origin(hint) is list:
        if not isinstance(value, (list, tuple)):
            raise bad()
        if item is None:
            return list(value)
        try:
            return [coerce(name, v, item) for v in value]
        except ValueError:
            raise bad() from None
    return value


def typed_fields(cls: type, values: dict[str, Any], where: str = "config field") -> dict[str, Any]:
    """``values`` (field name -> value) of the dataclass ``cls`` coerced to its fields' types; names that are not
    fields are passed through (the caller reports them with the valid names)."""
    import dataclasses

    hints = typing.get_type_hints(cls)
    items = {f.name: f.metadata.get("item") for f in dataclasses.fields(cls)}
    return {k: coerce(k, v, hints[k], items[k], where) if k in hints else v for k, v in values.items()}


def typed_overrides(algo: Any, overrides: Any, where: str = "objective_overrides") -> dict[str, Any]:
    """The overrides of objective ``algo`` coerced to the types of its config fields (``where`` names them in errors:
    ``objective_overrides`` or ``--params FILE``); unknown objectives and fields are left to the registry's errors."""
    from algorithms.registry import get_spec

    if not isinstance(overrides, dict) or not all(isinstance(k, str) for k in overrides):
        raise ValueError(f"{where}={overrides!r}: expected a mapping of field: value")
    if not isinstance(algo, str):
        return dict(overrides)
    spec = get_spec(algo)  # unknown objective: ValueError with the registered names
    return typed_fields(spec.config_class, overrides, where=f"{where}: {algo} field")


def tag_values(tags: dict[str, Any]) -> dict[str, Any]:
    """MLflow tags are text: a nested value (list, mapping) is refused rather than written as its repr."""
    for k, v in tags.items():
        if isinstance(v, (dict, list, tuple, set)):
            raise ValueError(f"config field `tags`: tag {k!r}={v!r}: expected a text or number value")
    return tags


def memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None where the system does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


PROMPT_TOKENS = 64  # prompt length assumed by the step's memory estimate (the built-in arith prompts: 50-70 tokens)
HOST_TOKEN_BYTES = 160  # per completion token kept on the host: ids, log-probs, entropies as lists and tensors


def sequence_bytes(shape: dict | None, max_new_tokens: int, dtype: str = "float32", *, tensors: bool = True
                   ) -> tuple[int, str]:
    """(bytes, what) one completion of a rollout batch holds at once, and a few words saying what they are. The HF
    sampler decodes a step's prompts x group-size completions in one batch (bench/rollout/hf.py, no chunking in the
    native loop), so each holds, until the batch ends: the KV cache of every layer over its prompt (``PROMPT_TOKENS``)
    plus ``max_new_tokens`` tokens, the vocabulary's logits (the model's, float32 scaled, probabilities, log-softmax,
    entropy terms: ~6 float32 rows), one decoding forward's activations, and its per-token statistics on the host. The
    update's scoring passes are micro-batched (``micro_batch_size``, chunked logits): bounded, not counted.
    ``tensors=False`` (the tensors live on a GPU, or another sampler bounds its cache): the host part only. A model
    without a readable config (a hub id): the token ids alone (8 bytes each: the lower bound it was before)."""
    if shape is None:
        return 8 * max_new_tokens, "the token ids alone"
    host = HOST_TOKEN_BYTES * max_new_tokens
    if not tensors:
        return host, "the per-token statistics kept on the host"

    def get(*names: str, default: int = 0) -> int:
        for n in names:
            if isinstance(shape.get(n), int) and shape[n] > 0:
                return shape[n]
        return default

    hidden = get("hidden_size", "n_embd", "d_model")
    layers = get("num_hidden_layers", "n_layer", "num_layers")
    heads = get("num_attention_heads", "n_head", default=1)
    kv_heads = get("num_key_value_heads", default=heads)
    head_dim = get("head_dim", default=hidden // max(heads, 1))
    vocab = get("vocab_size")
    inter = get("intermediate_size", "n_inner", default=4 * hidden)
    context = get("max_position_embeddings", "n_positions", default=PROMPT_TOKENS + max_new_tokens)
    tokens = min(PROMPT_TOKENS + max_new_tokens, max(context, max_new_tokens))
    width = 4 if dtype == "float32" else 2
    kv = 2 * layers * kv_heads * head_dim * tokens * width
    logits = 6 * 4 * vocab
    forward = (8 * hidden + 3 * inter + heads * tokens) * 4
    return (kv + logits + forward + host,
            f"the KV cache of {layers} layers over {tokens} tokens, the {vocab:,}-token vocabulary's logits and the "
            "per-token statistics")


def step_size(prompts_per_step: int, group_size: int, max_new_tokens: int, per_sequence: tuple[int, str] | None = None
              ) -> str | None:
    """Why a step of ``prompts_per_step`` x ``group_size`` completions of up to ``max_new_tokens`` tokens cannot be
    held (None when it can): what one completion of the rollout batch holds (``per_sequence``: ``sequence_bytes`` of
    the model; by default the token ids alone) times their number, against this machine's memory. (Held-out round 8:
    --prompts-per-step 100000000000 built its prompt pool for minutes, gigabytes, before anything was said; round 17,
    H03: --group-size 100000 passed the token-id count (77 MB) and grew to 22 GB before the OOM killer ended it.)"""
    memory = memory_bytes()
    each, what = per_sequence or (8 * max_new_tokens, "the token ids alone")
    need = prompts_per_step * group_size * each
    if memory is None or need <= memory:
        return None
    first, other = (("--group-size", "--prompts-per-step") if group_size > prompts_per_step
                    else ("--prompts-per-step", "--group-size"))
    return (f"{prompts_per_step} prompts x {group_size} completions x {max_new_tokens} tokens per step: "
            f"~{each / 2**10:,.0f} KiB each in the rollout ({what}), {need / 2**30:,.0f} GiB in all, more than this "
            f"machine's {memory / 2**30:,.0f} GiB of memory; give a smaller {first} (or {other} / --max-new-tokens)")


RESERVED_TAG_PREFIXES = ("pobench.", "mlflow.")


def user_tags(tags: Any) -> Any:
    """The user's tags (``--tags`` / a config's ``tags:``), refused in one line (ValueError) before any work when
    MLflow would refuse one (its own name and length rules: a traceback, with the run left RUNNING) or when a key is
    under a prefix pobench and MLflow write themselves (``pobench.objective`` mislabelled the run, which reuse and
    reports then mixed in; ``mlflow.runName`` was MLflow's traceback)."""
    if not isinstance(tags, dict):
        return tags
    tag_values(tags)
    for k, v in tags.items():
        where = f"config field `tags` (--tags): tag {str(k)[:80]!r}"
        if not isinstance(k, str) or not k:
            raise ValueError(f"{where}: a tag name must be non-empty text")
        if k.lower().startswith(RESERVED_TAG_PREFIXES):
            raise ValueError(f"{where}: names under {' and '.join(RESERVED_TAG_PREFIXES)} are written by pobench and "
                             "MLflow themselves (a run's identity, which reuse and reports read); rename the tag, "
                             "e.g. without that prefix")
        why = _mlflow_refuses(k, "" if v is None else str(v))
        if why:
            raise ValueError(f"{where}: MLflow cannot store it: {why}; rename the tag")
    return tags


def _mlflow_refuses(key: str, value: str) -> str | None:
    """Why MLflow would refuse tag ``key``=``value`` of a run (it is also logged as the param ``tags.<key>``), by
    MLflow's own checks (``mlflow.utils.validation``); None when it takes it whole."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils import validation as v

    try:
        v._validate_tag_name(key)
        v._validate_param_name(f"tags.{key}")
    except MlflowException as e:
        return str(e.message).split("supplied: ", 1)[-1].rstrip(".")
    if len(key) + len("tags.") > v.MAX_ENTITY_KEY_LENGTH:
        return f"a name is at most {v.MAX_ENTITY_KEY_LENGTH - len('tags.')} characters (it is also a param tags.<name>)"
    if len(value) > v.MAX_PARAM_VAL_LENGTH:
        return (f"its value has {len(value)} characters, over the {v.MAX_PARAM_VAL_LENGTH} a param keeps (it would be "
                "cut short); shorten it")
    return None


def read_yaml(path: str | Path, what: str = "--config") -> Any:
    """The YAML document in ``path``; ValueError in one line for a missing path, a folder, a binary file or invalid
    YAML (with the file, line and column)."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{what} {path}: is a folder; give a YAML file")
    if not_regular(p):  # (a pipe, a process substitution <(...): read once, a config is read twice)
        raise ValueError(f"{what} {path}: {NOT_REGULAR}; write the YAML to a file and give its path")
    if not p.is_file():
        raise ValueError(f"{what} {path}: {missing_file(p)}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path}: not a text file (a YAML file is expected)") from None
    except OSError as e:
        raise ValueError(f"{what} {path}: cannot be read ({e.strerror or e})") from None
    try:
        doc = yaml.load(text, Loader=_UniqueKeys)
    except yaml.YAMLError as e:
        raise ValueError(f"{what} {path}: invalid YAML{_where(e)}") from None
    why = _expansion_refusal(doc)
    if why:
        raise ValueError(f"{what} {path}: {why}; write the values out (pobench reads no YAML whose aliases (*name) "
                         f"repeat more than {YAML_MAX_VALUES:,} values)")
    return doc


#: the most values a YAML file's aliases may expand to: a real config has hundreds; an "alias bomb" of a few hundred
#: bytes (levels of lists of aliases of the level below) expands to billions, which any copy of the config would build
YAML_MAX_VALUES = 1_000_000


def _expansion_refusal(doc: Any) -> str | None:
    """Why ``doc`` (as YAML's loader built it: an alias is the same object again) cannot be read as a config: its
    values once every alias is expanded are more than ``YAML_MAX_VALUES``, or an alias contains itself; counted over
    the distinct objects (without expanding anything), so any field is safe to copy afterwards."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(doc, False)]
    while stack:
        obj, done = stack.pop()
        if not isinstance(obj, (dict, list)):
            continue
        key = id(obj)
        children = [*obj.keys(), *obj.values()] if isinstance(obj, dict) else obj
        if done:
            open_.discard(key)
            sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
            if sizes[key] > YAML_MAX_VALUES:
                return f"its aliases expand to more than {YAML_MAX_VALUES:,} values"
            continue
        if key in sizes:
            continue
        if key in open_:
            return "an alias refers to the mapping or list that contains it"
        open_.add(key)
        stack.append((obj, True))
        stack.extend((c, False) for c in children if isinstance(c, (dict, list)) and id(c) not in sizes)
    return None


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error (the plain loader keeps the last one
    silently: `algo: grpo` then `algo: dapo` trained dapo without a word)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:  # (its own keys, before a merge `<<: *base` adds the keys it may override)
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key_node.value!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _where(e: yaml.YAMLError) -> str:
    """`` at line L, column C: problem`` of a YAML error (1-based, as editors count)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or getattr(e, "context", None)
    if mark is None and isinstance(e, yaml.reader.ReaderError):  # a character YAML does not allow (binary data)
        return f" at character {e.position}: {e.reason} #x{e.character:04x}" if isinstance(e.character, int) else ""
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{at}: {problem}" if problem else at


def yaml_flag(text: str) -> Any:
    """argparse ``type`` of a mapping or list flag: YAML flow syntax (``{kl_coef: 0.1}``, ``[0.9, 0.95]``; JSON is
    YAML too)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a YAML mapping or list{_where(e)}") from None
    if not isinstance(value, (dict, list)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a mapping such as '{{kl_coef: 0.1}}' or a list such as "
                                         "'[0.9, 0.95]'")
    why = _expansion_refusal(value)
    if why:
        raise argparse.ArgumentTypeError(f"{text[:80]!r}: {why}; write the values out")
    return value


def name_list(text: str, flag: str) -> list[str]:
    """A comma-separated flag of names (``--benchmarks gsm8k,math500``): the names in order; ValueError for none, or
    for one given twice (held-out round 8: `--benchmarks arith,arith` evaluated arith twice, one result shadowing
    the other)."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise ValueError(f"{flag}: give at least one name")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{flag}: {', '.join(twice)} given twice; give each once")
    return names


def check_seed(value: Any, flag: str) -> int:
    """``value`` as a seed (an integer in [0, 2^32 - 1]); ValueError naming ``flag`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise ValueError(f"{flag} {value!r}: a seed must be an integer in [0, {SEED_MAX}]")
    return value


#: the prompt templates known by name (any other template is a format string that must hold ``{question}``)
PROMPT_TEMPLATES = ("auto", "chat", "plain")


def prompt_template_refusal(template: Any) -> str | None:
    """Why ``template`` is not a prompt template (a name of ``PROMPT_TEMPLATES``, or a format string holding
    ``{question}``, replaced by each question); None when it is one. Asked where the flags are checked, before any
    work (held-out round 9: ``--prompt-template '{nope}'`` was refused only once a run, a pair or a trial had
    started), and by ``bench.model.format_string`` when it formats."""
    if template in PROMPT_TEMPLATES:
        return None
    if not isinstance(template, str) or "{question}" not in template:
        return "must be auto, chat, plain, or a format string holding {question} (e.g. 'Question: {question} Answer:')"
    return None


FILE_STORE_ENV = "MLFLOW_ALLOW_FILE_STORE"  # MLflow's switch that lets it use its file store (a plain path)


def check_tracking_scheme(uri: str) -> str:
    """``uri`` when MLflow has a tracking store for its scheme (plugins included); ValueError listing them
    otherwise (MLflow's own error is a traceback from deep inside the first call)."""
    from mlflow.utils.uri import get_uri_scheme

    scheme = get_uri_scheme(uri).split("+")[0]
    known = _tracking_schemes()
    if scheme not in known:
        shown = ", ".join(f"{s}://" for s in sorted(known) if s)
        raise ValueError(f"tracking URI {uri!r}: unknown scheme {scheme!r}; MLflow stores: {shown} (fix "
                         "--tracking-uri / MLFLOW_TRACKING_URI)")
    if scheme == "sqlite" and (uri.rstrip("/") in ("sqlite:", "sqlite:/", "sqlite://")
                               or ":memory:" in uri or "mode=memory" in uri):
        raise ValueError(f"tracking URI {uri!r}: an in-memory SQLite store, which keeps nothing once the command ends "
                         "(the runs would be lost); give a file, e.g. --tracking-uri sqlite:///mlflow.db")
    if scheme in ("", "file") and os.environ.get(FILE_STORE_ENV, "").strip().lower() not in ("1", "true", "yes"):
        folder = urlparse(uri).path if scheme == "file" else uri  # (a plain path: MLflow's file store)
        raise ValueError(f"tracking URI {uri!r}: a plain path (or file:) is MLflow's file store, which MLflow refuses "
                         f"unless {FILE_STORE_ENV}=true (it is no longer developed); give a database, e.g. "
                         f"--tracking-uri sqlite:///{folder.rstrip('/') or '.'}/mlflow.db, or set "
                         f"{FILE_STORE_ENV}=true to use the file store")
    return uri


def _tracking_schemes() -> set[str]:
    try:  # MLflow's registry of tracking stores, with the schemes of installed plugins
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        return set(_tracking_store_registry._registry)
    except (ImportError, AttributeError):  # another MLflow layout: the schemes MLflow has long had
        return {"", "file", "databricks", "http", "https", "postgresql", "mysql", "sqlite", "mssql"}
