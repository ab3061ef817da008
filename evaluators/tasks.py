"""Shared types of the evaluators: one `Problem` per benchmark row, whatever its source format, and the `Task`
protocol that every task (the generated ``arith`` and each file / hub benchmark) implements."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from evaluators.sources import SourceRows


@dataclass(frozen=True)
class Problem:
    """One benchmark problem, independent of the file or hub layout it came from."""

    id: str
    """Stable id within its benchmark (the source's own id when it has one, else the row index)."""
    question: str
    """Problem text, without any prompt template applied."""
    answer: str
    """Reference FINAL answer, already extracted (e.g. ``"18"``, ``"\\frac{14}{3}"``)."""
    solution: str | None = None
    """Reference worked solution when the source has one."""


@runtime_checkable
class Task(Protocol):
    """What every task offers its callers (``evaluators.get_benchmark`` returns one): metadata, problems of a split,
    the training pool, and the reward. A task's own options (``arith``'s difficulty) are given at construction; the
    loading methods take the same arguments for every task. A generated task (``generated`` true) reads no files: it
    refuses a ``data`` source and ignores ``skip_bad_rows`` (it has no rows that could be bad)."""

    name: str
    version: str
    """Changes whenever the problems or the answer rules change: equal (name, version) scores were computed alike."""
    answer_kind: str
    """How answers are extracted and compared: number | integer | latex (see `evaluators.verify`)."""
    description: str
    generated: bool
    """True: problems are generated procedurally; False: they are read from a local file / folder or the hub."""

    def load(self, split: str = "test", data: str | os.PathLike | None = None, limit: int | None = None,
             skip_bad_rows: bool = False) -> list[Problem]:
        """Problems of `split` (the first `limit`), from `data` or the task's own source."""
        ...

    def load_rows(self, split: str = "test", data: str | os.PathLike | None = None, limit: int | None = None,
                  skip_bad_rows: bool = False) -> tuple[list[Problem], SourceRows]:
        """As `load`, also returning what was read: ``source`` names it (a path, a hub id, ``generated``) and
        ``skipped`` lists the rows skipped under `skip_bad_rows` (rows / where are empty for a generated task)."""
        ...

    def train_pool(self, seed: int, size: int, *, data: str | os.PathLike | None = None,
                   skip_bad_rows: bool = False) -> Sequence[Problem]:
        """The training problems a run cycles through, in its order, a pure function of `seed`: a generated task's
        first `size` problems of its `seed` stream; a file task's whole train split shuffled by `seed` (`size`, what
        the run needs at the least, does not cut it)."""
        ...

    def reward(self, completion: str, problem: Problem) -> float:
        """1.0 when `completion`'s final answer matches ``problem.answer``, else 0.0: the task's verifier."""
        ...


def checked_reward(task: Task, completion: str, problem: Problem) -> float:
    """``task.reward(completion, problem)`` as a float, refused in one line naming the task and the problem when it is
    not a finite real number (a plugin task's string, None, a tensor of several values, NaN or ±inf), which would
    otherwise surface as torch's error on the batch or as a "diverged" loss steps later. Every engine scores through
    it."""
    value, name = task.reward(completion, problem), getattr(task, "name", type(task).__name__)
    try:
        if isinstance(value, (str, bytes)) or value is None:
            raise TypeError
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"task {name!r} returned the reward {value!r:.60} "
                         f"({type(value).__name__}) for problem {problem.id!r}: a reward must be one finite number "
                         "(fix the task's reward)") from None
    if not math.isfinite(number):
        raise ValueError(f"task {name!r} returned the reward {number} for problem "
                         f"{problem.id!r}: a reward must be finite (fix the task's reward)")
    return number
