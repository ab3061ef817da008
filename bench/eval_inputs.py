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
