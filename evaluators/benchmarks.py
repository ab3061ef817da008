"""Versioned benchmark definitions: where each benchmark lives and how its fields map to `Problem`.

One `Benchmark` per benchmark, declared once in `DEFINITIONS`. Its ``version`` changes whenever the mapping or the
answer rules change, so that two scores with the same (name, version) were computed the same way. The built-in
``arith`` task (``evaluators/arith.py``, ``ArithTask``) is registered lazily under the name ``arith``. Both implement
the `Task` protocol (``evaluators/tasks.py``): `get_benchmark` returns a `Task`, whatever the name.
"""

from __future__ import annotations

import logging
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from evaluators.hints import check_registered_name
from evaluators.sources import BadRowError, SourceRows, read_source
from evaluators.tasks import Problem, Task
from evaluators.verify import (
    KINDS,
    format_number,
    is_correct,
    join_math_spans,
    last_boxed,
    strip_math_delimiters,
    to_number,
)

log = logging.getLogger(__name__)
#: the skipped rows said so far in this process, by (benchmark, split, source, rows): a command reads one file
#: several times (the inputs' check, their digests, the training), and said the same line each time (held-out
#: round 9: six times for one file given as --data and --eval-data)
_SKIPPED_SAID: set[tuple[str, str, str, tuple[str, ...]]] = set()

DATA_DIR_ENV = "POBENCH_DATA_DIR"
"""Optional folder holding ``<benchmark>/<split>.jsonl`` copies, used when no ``data`` is given."""


class EmptyAnswerError(BadRowError):
    """The source gives an empty reference answer: the row is dropped with a warning (it cannot be scored)."""


def _missing(row: dict, names: tuple[str, ...], found: Any, expected: str | None = None) -> str:
    """Why a row has no usable ``names`` field: one that is there but empty or not text is named as such (held-out
    round 10, H18: "expected field 'answer'; fields present: answer, question"); else the fields expected and the
    fields present."""
    if found is not None:  # (a value that is no text: a list, a number, a mapping)
        name = next(n for n in names if row.get(n) is found)
        return f"field {name!r} is a {type(found).__name__}, not text"
    empty = [n for n in names if n in row]
    if empty:
        return f"field {empty[0]!r} is empty"
    return (f"expected field {expected or ' or '.join(map(repr, names))}; "
            f"fields present: {', '.join(sorted(row)) or 'none'}")


def _strip_dollars(text: str) -> str:
    """``$2^{1009}$`` -> ``2^{1009}``; ``$69$,$84$`` -> ``69, 84``."""
    text = text.strip()
    joined = join_math_spans(text) if text.startswith("$") else None
    return joined if joined is not None else strip_math_delimiters(text)


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: its source and the mapping of that source's fields onto `Problem` (a `Task` read from files)."""

    generated: ClassVar[bool] = False
    name: str
    version: str
    answer_kind: str
    """How answers are extracted and compared: number | integer | latex (see `evaluators.verify`)."""
    description: str
    hub_id: str
    """Its usual Hugging Face hub id (used when no local ``data`` is given)."""
    hub_config: str | None = None
    hub_splits: tuple[tuple[str, str], ...] = (("test", "test"),)
    """(our split, hub split) pairs; their first elements are the splits this benchmark has."""
    question_fields: tuple[str, ...] = ("problem", "question")
    """First present, non-empty field is the question."""
    context_fields: tuple[str, ...] = ()
    """Optional fields prepended to the question (OlympiadBench's shared context)."""
    answer_fields: tuple[str, ...] = ("answer",)
    answer_marker: str | None = None
    """The answer field holds a worked solution ending with ``<marker> N`` (GSM8K's ``####``)."""
    answer_in_solution: bool = False
    """Without an answer field, the reference answer is the last ``\\boxed{}`` of the solution."""
    solution_fields: tuple[str, ...] = ("solution",)
    id_fields: tuple[str, ...] = ("id", "unique_id", "idx")
    data_dir: str | None = None
    """A local file or folder of the task's own problems (a plugin's data files), read when no ``data`` is given and
    ``$POBENCH_DATA_DIR`` has no folder of it; its content digest is part of a run's identity
    (bench/runs/identity.py)."""

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(ours for ours, _ in self.hub_splits)

    # ------------------------------------------------------------------------------------------ loading
    def load(self, split: str = "test", data: str | os.PathLike | None = None, limit: int | None = None,
             skip_bad_rows: bool = False) -> list[Problem]:
        """Problems of `split` from `data` (local file / folder or hub id), else the usual hub id.

        ``limit`` keeps the first N problems. ``skip_bad_rows`` skips (and logs) malformed rows and rows without a
        reference answer instead of raising `BadRowError`. Rows whose reference answer is empty are always dropped
        with a warning.
        """
        return self.load_rows(split, data, limit, skip_bad_rows)[0]

    def load_rows(self, split: str = "test", data: str | os.PathLike | None = None, limit: int | None = None,
                  skip_bad_rows: bool = False) -> tuple[list[Problem], SourceRows]:
        """As `load`, also returning the raw source (what was read, which rows were skipped)."""
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        hub_split = dict(self.hub_splits).get(split)
        if data is None and hub_split is None:
            raise ValueError(f"benchmark {self.name!r} has no split {split!r}; valid: {', '.join(self.splits)}")
        if data is None and os.environ.get(DATA_DIR_ENV) and (Path(os.environ[DATA_DIR_ENV]) / self.name).is_dir():
            data = Path(os.environ[DATA_DIR_ENV]) / self.name
        if data is None and self.data_dir:
            data = self.data_dir
        if data is None:
            source = read_source(self.hub_id, split, hub_config=self.hub_config, hub_split=hub_split)
        else:
            source = read_source(data, split, skip_bad_rows, hub_config=self.hub_config, hub_split=hub_split)
        problems: list[Problem] = []
        for index, (row, where) in enumerate(zip(source.rows, source.where)):
            if limit is not None and len(problems) >= limit:
                break
            try:
                problems.append(self.to_problem(row, where, f"{split}-{index}"))
                source.kept.append(where)
            except EmptyAnswerError as e:  # a source defect (MATH train has one `\boxed{}`): cannot be scored
                source.skipped.append(str(e))
            except BadRowError as e:
                if not skip_bad_rows:
                    raise
                source.skipped.append(str(e))
        said = (self.name, split, os.path.realpath(source.source), tuple(source.skipped))
        if source.skipped and said not in _SKIPPED_SAID:  # once per file and split (training data, held out)
            _SKIPPED_SAID.add(said)
            log.warning("%s (%s split): skipped %d bad row(s) of %s: %s", self.name, split, len(source.skipped),
                        source.source, "; ".join(source.skipped[:5]) + (" ..." if len(source.skipped) > 5 else ""))
        if not problems:
            raise ValueError(f"{self.name}: no problems in {source.source}")
        return problems, source

    def train_pool(self, seed: int, size: int, *, data: str | os.PathLike | None = None,
                   skip_bad_rows: bool = False) -> list[Problem]:
        """The whole train split, shuffled by `seed` (`size` does not cut it: every row is used)."""
        pool = self.load(split="train", data=data, skip_bad_rows=skip_bad_rows)
        random.Random(f"pobench-data-{seed}").shuffle(pool)
        return pool

    def _first(self, row: dict, names: tuple[str, ...]) -> Any:
        for name in names:
            value = row.get(name)
            if value is not None and value != "" and value != []:
                return value
        return None

    def to_problem(self, row: dict, where: str, fallback_id: str) -> Problem:
        """Map one source row to a `Problem`; a row without question or answer raises `BadRowError`."""
        question = self._first(row, self.question_fields)
        if not isinstance(question, str):
            raise BadRowError(f"{where}: no question: {_missing(row, self.question_fields, question)}")
        context = self._first(row, self.context_fields)
        if isinstance(context, str) and context.strip():
            question = context.strip() + "\n\n" + question
        solution = self._first(row, self.solution_fields)
        if isinstance(solution, list):
            solution = "\n\n".join(str(s) for s in solution)
        answer = self._answer(row, where, solution)
        ident = self._first(row, self.id_fields)
        return Problem(id=str(ident) if ident is not None else fallback_id, question=question, answer=answer,
                       solution=solution if isinstance(solution, str) else None)

    def _answer(self, row: dict, where: str, solution: str | None) -> str:
        value = self._first(row, self.answer_fields)
        if isinstance(value, str) and self.answer_marker:
            if self.answer_marker in value:
                value = value.rsplit(self.answer_marker, 1)[1].strip()
            elif to_number(value) is None:
                raise BadRowError(f"{where}: answer field {self.answer_fields[0]!r} has no '{self.answer_marker} N' "
                                  f"final-answer marker: {value[-80:]!r}")
        if value is None and self.answer_in_solution and solution:
            value = last_boxed(solution)
        if value is None:
            expected = " or ".join(map(repr, self.answer_fields))
            if self.answer_in_solution:
                expected += f" (or a \\boxed{{}} in {' or '.join(map(repr, self.solution_fields))})"
            raise BadRowError(f"{where}: no reference answer: {_missing(row, self.answer_fields, None, expected)}")
        if isinstance(value, list):
            text = ", ".join(_strip_dollars(str(v)) for v in value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            text = format_number(to_number(repr(value)) if isinstance(value, float) else to_number(str(value)))
        else:
            text = _strip_dollars(str(value))
        if self.answer_kind in ("number", "integer"):
            number = to_number(text)
            if number is not None:
                text = format_number(number)
        if not text:
            raise EmptyAnswerError(f"{where}: empty reference answer (row dropped)")
        return text

    # ------------------------------------------------------------------------------------------ scoring
    def reward(self, completion: str, problem: Problem) -> float:
        """1.0 when the completion's final answer equals the reference, else 0.0: this benchmark's verifier."""
        return 1.0 if is_correct(completion, problem.answer, self.answer_kind) else 0.0


_MATH_QUESTION = ("problem", "question", "Problem")
_MATH_ANSWER = ("answer", "Answer")

DEFINITIONS: tuple[Benchmark, ...] = (
    Benchmark("gsm8k", "1.0", "number", "GSM8K grade-school word problems (Cobbe et al. 2021, arXiv:2110.14168)",
              hub_id="openai/gsm8k", hub_config="main", hub_splits=(("train", "train"), ("test", "test")),
              question_fields=("question", "problem"), answer_fields=("answer",), answer_marker="####",
              solution_fields=("answer",)),
    Benchmark("math", "1.0", "latex", "MATH competition problems, full 7.5k train / 5k test (Hendrycks et al. 2021, "
              "arXiv:2103.03874)", hub_id="DigitalLearningGmbH/MATH-lighteval",
              hub_splits=(("train", "train"), ("test", "test")), answer_in_solution=True),
    Benchmark("math500", "1.0", "latex", "MATH-500, the 500-problem MATH test subset of Lightman et al. 2023 "
              "(arXiv:2305.20050)", hub_id="HuggingFaceH4/MATH-500", answer_in_solution=True),
    Benchmark("aime24", "1.0", "integer", "AIME 2024 I and II (30 problems, integer answers 0-999)",
              hub_id="HuggingFaceH4/aime_2024", hub_splits=(("test", "train"),), question_fields=_MATH_QUESTION,
              answer_fields=_MATH_ANSWER, id_fields=("id", "ID")),
    Benchmark("aime25", "1.0", "integer", "AIME 2025 I and II (30 problems, integer answers 0-999)",
              hub_id="math-ai/aime25", question_fields=_MATH_QUESTION, answer_fields=_MATH_ANSWER,
              id_fields=("id", "ID")),
    Benchmark("amc23", "1.0", "integer", "AMC 12 2023 (40 problems with integer answers)", hub_id="math-ai/amc23",
              question_fields=_MATH_QUESTION, answer_fields=_MATH_ANSWER),
    Benchmark("minerva_math", "1.0", "latex", "Minerva OCW undergraduate STEM problems (272; Lewkowycz et al. 2022, "
              "arXiv:2206.14858)", hub_id="math-ai/minervamath", answer_in_solution=True),
    Benchmark("olympiadbench", "1.0", "latex", "OlympiadBench open-ended English math, text-only competition problems "
              "(675; He et al. 2024, arXiv:2402.14008)", hub_id="Hothan/OlympiadBench",
              hub_config="OE_TO_maths_en_COMP", hub_splits=(("test", "train"),),
              question_fields=("question", "problem"), context_fields=("context",),
              answer_fields=("final_answer", "answer")),
)


_BY_NAME: dict[str, Benchmark] = {}
for _b in DEFINITIONS:
    if _b.name in _BY_NAME:
        raise ValueError(f"benchmark {_b.name!r} defined twice")
    if _b.answer_kind not in KINDS:
        raise ValueError(f"benchmark {_b.name!r}: answer_kind must be one of {KINDS}")
    _BY_NAME[_b.name] = _b


ARITH = "arith"
"""The built-in task: `evaluators.arith.ArithTask`, a generated `Task`."""


def _arith(**options: Any) -> Task:
    from evaluators.arith import ArithTask  # lazy: only needed when used

    return ArithTask(**options)


_GENERATED: dict[str, tuple[Callable[..., Task], tuple[str, ...]]] = {ARITH: (_arith, ("difficulty",))}
"""Tasks made by a factory (the built-in ``arith``, and those of plugins): name -> (factory, the options it takes)."""
_REGISTERED_BY: dict[str, str] = {}
"""Tasks registered with `register_task`: name -> the module that registered it."""


def register_task(task: Task | Callable[..., Task], name: str | None = None, options: tuple[str, ...] = (),
                  module: str | None = None) -> None:
    """Register a task of your own (a plugin: docs/PLUGINS.md): a `Task` (e.g. a `Benchmark` with its own source and
    ``reward``), or a factory ``task(**options)`` that returns one, under ``name`` (default: the task's own
    ``name``). ``options``: the run settings the factory takes (``difficulty``). A name already taken raises."""
    if name is None:
        name = getattr(task, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError("register_task: give the task's name (a factory has none)")
    check_registered_name(name, "task")  # it becomes folders and MLflow keys
    if name in _BY_NAME or name in _GENERATED:
        raise ValueError(f"task {name!r} is already registered")
    if isinstance(task, type) or not hasattr(task, "reward"):  # a class or function that makes the task
        _GENERATED[name] = (task, tuple(options))
    else:
        _GENERATED[name] = (lambda t=task: t, ())
    _REGISTERED_BY[name] = module if module is not None else sys._getframe(1).f_globals.get("__name__", "")


def unregister_task(name: str) -> None:
    """Remove a task registered with `register_task` (for plugins and tests); the built-in ones stay."""
    if name in _REGISTERED_BY:
        del _GENERATED[name], _REGISTERED_BY[name]


def task_module(name: str) -> str:
    """The module that registered task ``name`` (``evaluators`` for the built-in ones)."""
    return _REGISTERED_BY.get(name, "evaluators")


def list_benchmarks() -> list[str]:
    """Names of every benchmark, built-in ``arith`` included."""
    return [*_BY_NAME, *_GENERATED]


def get_benchmark(name: str, **options: Any) -> Task:
    """The benchmark called `name` (``arith`` takes a ``difficulty`` option). Unknown name -> ValueError."""
    if name in _GENERATED:
        return _GENERATED[name][0](**options)
    if name not in _BY_NAME:
        from evaluators.hints import did_you_mean

        raise ValueError(f"unknown benchmark {name!r}{did_you_mean(name, list_benchmarks())}; "
                         f"valid: {', '.join(list_benchmarks())}")
    if options:
        raise ValueError(f"benchmark {name!r} takes no options, got {', '.join(options)}")
    return _BY_NAME[name]


def get_task(name: str, **settings: Any) -> Task:
    """The task `name` for a run: of the run's task settings (``difficulty``), those the task takes are passed to it
    and the others ignored, since one run configuration serves whatever task it names (`get_benchmark` refuses an
    option the task does not take)."""
    taken = _GENERATED[name][1] if name in _GENERATED else ()
    return get_benchmark(name, **{k: v for k, v in settings.items() if k in taken})
