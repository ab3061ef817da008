"""Inputs checked before work: every source a run needs is resolved, and its problems counted, before the first model
loads (`bench train`, `bench run` and `bench tune` call ``check_inputs``; `bench eval` calls ``answer_check``).

- the model and its tokenizer: a built-in or local folder must exist; a hub id under ``HF_HUB_OFFLINE=1`` must be in
  the local Hugging Face cache (one line naming ``--model``, no retries);
- the training and held-out data: read once here (a hub source then sits in the ``datasets`` cache for the runs); a
  source that cannot be read is one line naming the flag that gives a local one (``--data`` / ``--eval-data``);
- reference answers the task's verifier cannot parse (a number task whose answer is no number, e.g. gsm8k
  ``#### banana``): counted, one warning with the count and an example; refused when none parses (every reward
  would be 0);
- prompts that do not fit the model's context with ``--max-new-tokens`` completion tokens: counted, one warning with
  the count and an example.

Generated tasks (``arith``) are correct by construction and are not read here.
"""

from __future__ import annotations

import json
from pathlib import Path

from algorithms import default_config
from bench.runs import identity
from evaluators import get_task
from evaluators.sources import looks_like_hub_id
from evaluators.verify import to_number

NUMBER_KINDS = ("number", "integer")  # answer kinds whose reference must be a number to be matched at all


def check_model(model: str, revision: str | None = None) -> None:
    """The model source exists; offline, a hub id must be in the local cache (ValueError naming --model)."""
    from bench.model import resolve_model_path

    path = resolve_model_path(model)  # built-in, local folders: FileNotFoundError naming it
    if Path(path).is_dir():
        return
    if identity.offline() and identity.cached_revision(model, revision) is None:
        raise ValueError(f"--model {model}{f' --revision {revision}' if revision else ''}: not in the local Hugging "
                         "Face cache and HF_HUB_OFFLINE is set (no network); pass --model PATH to a local model folder")


def load_side(task_name: str, data: str | None, split: str, flag: str, *, difficulty: int, skip_bad_rows: bool,
              limit: int | None = None) -> list:
    """The problems of one side of a run (training or held-out), or one line naming ``flag``."""
    task = get_task(task_name, difficulty=difficulty)
    source = identity.task_source(task_name, data, difficulty)
    try:
        return task.load(split=split, data=data, limit=limit, skip_bad_rows=skip_bad_rows)
    except (ValueError, OSError) as e:  # (a file or folder that cannot be read: its own OSError, one line too)
        if source is not None and looks_like_hub_id(source):
            why = " (HF_HUB_OFFLINE is set)" if identity.offline() else ""
            raise ValueError(f"{flag}: the {split} split of {task_name} ({source}) could not be read from the Hugging "
                             f"Face hub{why}; pass a local JSONL / JSON / parquet file or folder with {flag} PATH"
                             ) from None
        msg = f"{e.filename}: cannot be read ({e.strerror})" if isinstance(e, OSError) and e.filename else str(e)
        msg = msg if msg.startswith(flag) else f"{flag}: {msg}"
        # (the same kind of error with the flag in front; ValueError where the kind takes more than a message,
        # e.g. a UnicodeDecodeError, which it once rebuilt with one argument: a TypeError in place of the line)
        raise (FileNotFoundError if isinstance(e, FileNotFoundError) else ValueError)(msg) from None


def answer_check(task, problems: list, what: str) -> str | None:
    """A warning when some reference answers cannot be parsed by the task's verifier; ValueError when none can."""
    if task.answer_kind not in NUMBER_KINDS or not problems:
        return None
    bad = [p for p in problems if to_number(p.answer) is None]
    if not bad:
        return None
    example = f"problem {bad[0].id}: {bad[0].answer[:60]!r}"
    if len(bad) == len(problems):
        raise ValueError(f"{what}: none of the {len(problems)} reference answers of {task.name} is a number its "
                         f"verifier can match (e.g. {example}); every reward would be 0")
    return (f"{len(bad)} of {len(problems)} reference answers of {what} are not numbers its verifier can match "
            f"(e.g. {example}); those problems always score 0")


def prompt_check(cfg, problems: list, what: str) -> str | None:
    """A warning when some prompts plus ``max_new_tokens`` do not fit the model's context."""
    if not problems:
        return None
    from transformers import AutoConfig, AutoTokenizer

    from bench.model import format_prompt, resolve_model_path

    path = resolve_model_path(cfg.model)
    try:
        limit = getattr(AutoConfig.from_pretrained(path, revision=cfg.revision), "max_position_embeddings", None)
        tok = AutoTokenizer.from_pretrained(path, revision=cfg.revision) if limit is not None else None
    except OSError as e:  # a hub id neither cached nor reachable (offline), a folder without config / tokenizer
        why = " (HF_HUB_OFFLINE is set)" if identity.offline() else ""
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"--model {cfg.model}: its config and tokenizer could not be loaded{why}: {first}; pass a "
                         "local model folder with --model PATH") from None
    if limit is None:
        return None
    lengths = [len(tok(format_prompt(tok, p.question, cfg.prompt_template))["input_ids"]) for p in problems]
    over = [(n, p) for n, p in zip(lengths, problems) if n + cfg.max_new_tokens > limit]
    if not over:
        return None
    n, p = max(over, key=lambda x: x[0])
    return (f"{len(over)} of {len(problems)} {what} prompts plus --max-new-tokens {cfg.max_new_tokens} exceed the "
            f"model's context of {limit} tokens (e.g. problem {p.id}: {n} prompt tokens); their completions are "
            "cut short")


def generated_prompt_check(cfg, task, split: str, what: str, limit: int | None) -> str | None:
    """``prompt_check`` for a generated task, on the problems it would use (at most 64 of the split). The model's
    context is read from a local model's config.json without loading a tokenizer: a ``--max-new-tokens`` that is at
    least the context is said at once; the prompts are tokenized only when ``--max-new-tokens`` takes more than half of
    the context (a generated task's prompts are short), so the usual run pays nothing for the check. A hub model is
    not looked up (as before)."""
    from bench.model import resolve_model_path

    config = Path(resolve_model_path(cfg.model)) / "config.json"
    try:
        context = json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else None
    except (OSError, ValueError, AttributeError):
        context = None
    if context is not None and cfg.max_new_tokens >= context:
        return (f"--max-new-tokens {cfg.max_new_tokens} is at least the model's context of {context} tokens: every "
                f"{what} completion is cut short (its prompt takes part of the context); give --max-new-tokens below "
                f"{context}")
    if context is not None and 2 * cfg.max_new_tokens > context:  # (a hub model's context: not looked up here)
        return prompt_check(cfg, task.load(split, limit=min(limit or 64, 64)), what)
    return None


def range_warning(algo: str, overrides: dict) -> str | None:
    """One warning naming the fields of objective ``algo`` (with ``overrides``) whose values lie outside the ranges
    it declares (``param(search=...)``); None when there are none. A warning, not a refusal: a value outside the
    search range can be a deliberate ablation, but a threshold there may keep its term from ever acting."""
    outside = default_config(algo, **dict(overrides)).outside_ranges()
    if not outside:
        return None
    fields = ", ".join(f"{n}={v:g} (declared range [{lo:g}, {hi:g}])" for n, (v, lo, hi) in outside.items())
    verb = "is outside the range" if len(outside) == 1 else "are outside the ranges"
    return (f"objective {algo}: {fields} {verb} it declares (bench list --details): a threshold there may keep its "
            "term from ever acting (TEPO's KL mask); check the value")


def check_inputs(cfg) -> list[str]:
    """Resolve and read every input of ``cfg`` before any model loads (module doc). Returns the warnings; raises
    ValueError / FileNotFoundError (one line naming the flag) for what would make the run fail or meaningless."""
    check_model(cfg.model, cfg.revision)
    warnings = [w for w in [range_warning(cfg.algo, cfg.objective_overrides)] if w]
    sides = (("training", cfg.task, cfg.data, "train", "--data", None),
             ("held-out", cfg.eval_task or cfg.task, cfg.eval_data, "test", "--eval-data", cfg.eval_problems))
    for what, task_name, data, split, flag, limit in sides:
        task = get_task(task_name, difficulty=cfg.difficulty)
        if task.generated:  # (nothing to read; its prompts against the context: held-out round 10, H16)
            warnings += [w for w in [generated_prompt_check(cfg, task, split, what, limit)] if w]
            continue
        problems = load_side(task_name, data, split, flag, difficulty=cfg.difficulty,
                             skip_bad_rows=cfg.skip_bad_rows, limit=limit)
        found = [answer_check(task, problems, f"the {what} data ({flag} {data or task_name})"),
                 prompt_check(cfg, problems, what)]
        warnings += [w for w in found if w]
    return warnings
