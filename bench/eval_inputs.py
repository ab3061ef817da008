"""What `bench eval` settles before it evaluates, the same for one model and for every final model of a comparison
(``bench/comparison/evals.py``): its counts and prompt template checked (:func:`check_settings`), each benchmark's
``--data`` source and the completion length limit."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bench.inputs import prompt_template_refusal

if TYPE_CHECKING:
    from evaluators import Task

DEFAULT_MAX_NEW_TOKENS = 512


def check_settings(*, limit: int | None, k: int, samples: int | None, max_new_tokens: int | None,
                   batch_size: int | None, prompt_template: str | None) -> None:
    """One line (ValueError) for a count out of range or an unknown prompt template, before any model is loaded; the
    same checks for one model and for `--comparison`. A 0 was read as "not given" (held-out round 8: ``--limit 0``
    evaluated every problem; round 9: ``--max-new-tokens 0`` evaluated with 512, ``--batch-size 0`` with the
    engine's default)."""
    if limit is not None and limit < 1:
        raise ValueError(f"--limit {limit}: must be >= 1 (leave it out to evaluate every problem)")
    if k < 1 or (samples is not None and samples < k):
        raise ValueError(f"--k {k}" + (f" / --samples {samples}" if samples is not None else "")
                         + ": need k >= 1 and samples >= k")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {max_new_tokens}: must be >= 1 (leave it out for "
                         f"{DEFAULT_MAX_NEW_TOKENS}, capped by the model's context)")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"--batch-size {batch_size}: must be >= 1 (leave it out for the engine's default)")
    why = prompt_template_refusal(prompt_template) if prompt_template is not None else None
    if why:
        raise ValueError(f"--prompt-template {prompt_template!r}: {why}")


def resolve_data(benchmarks: list[Task], specs: list[str]) -> dict[str, str | None]:
    """Map each benchmark to its --data source (None: the benchmark's hub id, or a generated task's own problems)."""
    names = [b.name for b in benchmarks]
    generated = {b.name for b in benchmarks if b.generated}
    named: dict[str, str] = {}
    plain: list[str] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if sep and name in names:
            named[name] = path
        elif sep and not Path(spec).exists():
            raise ValueError(f"--data {spec}: {name!r} is not one of the benchmarks being evaluated "
                             f"({', '.join(names)})")
        else:
            plain.append(spec)
    if len(plain) > 1:
        raise ValueError(f"--data: give at most one PATH without NAME= (got {', '.join(plain)})")
    out: dict[str, str | None] = {}
    for name in names:
        if name in named:
            out[name] = named[name]
        elif plain and Path(plain[0], name).is_dir():
            out[name] = str(Path(plain[0], name))
        elif plain and len(names) == 1:
            out[name] = plain[0]
        elif plain and name not in generated:  # a generated task needs no sub-folder
            raise ValueError(f"--data {plain[0]}: no {name}/ sub-folder; with several benchmarks use NAME=PATH")
        else:
            out[name] = None
    return out


def max_new_tokens(requested: int | None, model, prompt_lengths: list[int]) -> int:
    """--max-new-tokens, or the default capped by the model's context; warns when prompts do not fit."""
    limit = getattr(model.config, "max_position_embeddings", None)
    chosen = DEFAULT_MAX_NEW_TOKENS if requested is None else requested  # (>= 1: check_settings)
    if limit is None:
        return chosen
    if requested is None:
        chosen = max(16, min(DEFAULT_MAX_NEW_TOKENS, limit - max(prompt_lengths)))
        if chosen < DEFAULT_MAX_NEW_TOKENS:
            print(f"bench eval: --max-new-tokens {chosen} (the model's context is {limit} tokens)", file=sys.stderr)
    too_long = sum(n + chosen > limit for n in prompt_lengths)
    if too_long:
        print(f"bench eval: warning: {too_long} of {len(prompt_lengths)} prompts plus {chosen} new tokens exceed the "
              f"model's context of {limit} tokens; their completions are unreliable", file=sys.stderr)
    return chosen


def drop_prompts_past_context(model: str, loaded: list, template: str, skip_bad_rows: bool) -> list:
    """``loaded`` ((task, problems, source) per benchmark, ``source`` the task's ``SourceRows`` or its name) without
    the problems whose prompt alone is longer than the model's context: one line (ValueError) naming the row
    (``file:line``) unless ``skip_bad_rows``, when they are skipped and counted in one line each benchmark. Read
    from the model's tokenizer and config only, before the model loads. Held-out round 11 (H03): a 6 MB question was
    a warning, then the model asked for 36 TB and a 70-line traceback (and it cut every row's --max-new-tokens)."""
    from transformers import AutoConfig, AutoTokenizer

    from bench.model import format_prompt, resolve_model_path

    try:
        path = resolve_model_path(model)
        limit = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
        tok = AutoTokenizer.from_pretrained(path) if limit is not None else None
    except (OSError, ValueError):  # (a model that cannot be read: the model load says so in its own line)
        return loaded
    if limit is None:
        return loaded
    out = []
    for task, problems, source in loaded:
        kept = getattr(source, "kept", [])
        where = kept if len(kept) == len(problems) else [f"{task.name} problem {p.id}" for p in problems]
        lengths = [len(tok(format_prompt(tok, p.question, template))["input_ids"]) for p in problems]
        over = [(w, n) for w, n in zip(where, lengths) if n >= limit]
        if over and not skip_bad_rows:
            more = f" ({len(over) - 1} more such row(s))" if len(over) > 1 else ""
            raise ValueError(f"{over[0][0]}: its prompt is {over[0][1]} tokens, not shorter than the model's context "
                             f"of {limit} tokens, so it cannot be evaluated{more}; shorten or remove the row, or pass "
                             "--skip-bad-rows to skip such rows")
        if over:
            print(f"bench eval: {task.name}: skipped {len(over)} row(s) whose prompt is not shorter than the model's "
                  f"context of {limit} tokens: {', '.join(w for w, _ in over[:5])}"
                  f"{' ...' if len(over) > 5 else ''}", file=sys.stderr)
            problems = [p for p, n in zip(problems, lengths) if n < limit]
            if not problems:
                raise ValueError(f"{task.name}: no problem left: every prompt is longer than the model's context of "
                                 f"{limit} tokens")
        out.append((task, problems, source))
    return out
