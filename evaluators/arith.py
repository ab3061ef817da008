"""The built-in `arith` task: procedurally generated multi-step arithmetic word problems in GSM8K's answer format.

A problem is a short story, kept compact because the built-in policy reads one character per token ("Ann has 12 pens,
gets 34, loses 5. How many now?"), whose reference solution works the running total one line per step and ends with
GSM8K's final-answer marker::

    12+34=46
    46-5=41
    #### 41

Train and test never overlap: every problem's arithmetic content (its operands and operators) is hashed, and the hash
puts it in exactly one partition (``_is_test``), whatever the seed or the wording. The train stream is infinite and
deterministic for a seed; the test set is a fixed list (the first ``n`` distinct test-partition problems of one fixed
stream), so ``test_set(400)`` is a prefix of ``test_set(1000)``.

The reward is the GSM8K verifier of the evaluators (``evaluators.verify.is_correct(completion, answer, "number")``), so
the training reward and the benchmark score cannot drift apart.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from evaluators.sources import SourceRows
from evaluators.tasks import Problem

VERSION = "1"


@dataclass(frozen=True)
class Difficulty:
    """One difficulty level: how many operands, how large, and whether subtraction appears."""

    min_operands: int
    max_operands: int
    max_value: int          # operands are drawn from 1..max_value
    subtraction: bool       # steps may subtract (the running total never goes below zero)


# Reference solutions (with the leading space of the plain template and the eos token) stay <= 48 tokens up to level 3.
DIFFICULTIES: dict[int, Difficulty] = {
    1: Difficulty(2, 2, 99, False),   # one addition
    2: Difficulty(2, 4, 99, False),   # 1-3 additions (the default: the setting the warm-start recipe was tuned on)
    3: Difficulty(2, 4, 99, True),    # 1-3 additions or subtractions
    4: Difficulty(3, 5, 99, True),    # 2-4 additions or subtractions (solutions up to ~50 characters)
}

_NAMES = ["Ann", "Bob", "Cy", "Dee", "Eve", "Max", "Sam", "Zoe"]
_ITEMS = ["apples", "pens", "cards", "coins", "books", "eggs", "shells", "stamps"]
_ADD = ["gets", "buys", "finds"]
_SUB = ["loses", "sells", "uses"]

_TEST_SEED = 20_240_917      # the fixed stream the test set is drawn from
_TEST_FRACTION = 5           # one problem in 5 (by content hash) belongs to the test partition


def _is_test(ops: tuple[str, ...], values: tuple[int, ...]) -> bool:
    """Partition by arithmetic content: the same numbers and operators always land on the same side."""
    key = ",".join(str(v) for v in values) + "|" + "".join(ops)
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % _TEST_FRACTION == 0


class ArithTask:
    """Multi-step arithmetic word problems; `difficulty` is a key of ``DIFFICULTIES`` (1 = easiest). Implements
    `evaluators.tasks.Task` as a generated task: no `data` source, ``skip_bad_rows`` has nothing to skip."""

    name = "arith"
    version = VERSION
    answer_kind = "number"
    description = "pobench's built-in multi-step arithmetic word problems in GSM8K's answer format (generated)"
    generated = True

    def __init__(self, difficulty: int = 2):
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"arith difficulty {difficulty!r} is not defined; valid: {sorted(DIFFICULTIES)}")
        self.difficulty = difficulty
        self.level = DIFFICULTIES[difficulty]

    # --- generation
    def _draw(self, rng: random.Random) -> tuple[tuple[str, ...], tuple[int, ...], str, str]:
        """One random problem: (operators, operands, question, solution)."""
        lv = self.level
        k = rng.randint(lv.min_operands, lv.max_operands)
        values = [rng.randint(1, lv.max_value)]
        ops: list[str] = []
        total = values[0]
        for _ in range(k - 1):
            subtract = lv.subtraction and total > 1 and rng.random() < 0.5
            if subtract:
                v = rng.randint(1, min(total, lv.max_value))
                ops.append("-")
                total -= v
            else:
                v = rng.randint(1, lv.max_value)
                ops.append("+")
                total += v
            values.append(v)
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        clauses = [f"{name} has {values[0]} {item}"]
        clauses += [f"{rng.choice(_ADD if op == '+' else _SUB)} {v}" for op, v in zip(ops, values[1:])]
        question = ", ".join(clauses) + ". How many now?"
        lines, running = [], values[0]
        for op, v in zip(ops, values[1:]):
            new = running + v if op == "+" else running - v
            lines.append(f"{running}{op}{v}={new}")
            running = new
        lines.append(f"#### {running}")
        return tuple(ops), tuple(values), question, "\n".join(lines)

    def train_stream(self, seed: int = 0) -> Iterator[Problem]:
        """Infinite deterministic stream of training problems (never in the test partition; may repeat)."""
        rng = random.Random(f"arith-train-d{self.difficulty}-s{seed}")
        i = 0
        while True:
            ops, values, question, solution = self._draw(rng)
            if _is_test(ops, values):
                continue
            yield Problem(id=f"arith-d{self.difficulty}-train-s{seed}-{i}", question=question,
                          answer=str(_final(solution)), solution=solution)
            i += 1

    def test_set(self, n: int = 400) -> list[Problem]:
        """The first `n` distinct held-out problems (fixed for a difficulty; a prefix of any larger test set)."""
        if n < 1:
            raise ValueError(f"arith test_set: n must be >= 1, got {n}")
        rng = random.Random(f"arith-test-d{self.difficulty}-{_TEST_SEED}")
        seen: set[tuple] = set()
        out: list[Problem] = []
        misses = 0  # draws since the last new problem: a long run means the partition is exhausted
        while len(out) < n:
            misses += 1
            if misses > 50_000:
                raise ValueError(f"arith difficulty {self.difficulty} has fewer than {n} distinct test problems "
                                 f"(found {len(out)})")
            ops, values, question, solution = self._draw(rng)
            if not _is_test(ops, values) or (ops, values) in seen:
                continue
            misses = 0
            seen.add((ops, values))
            out.append(Problem(id=f"arith-d{self.difficulty}-test-{len(out)}", question=question,
                               answer=str(_final(solution)), solution=solution))
        return out

    # --- the Task interface of the evaluators (evaluators.tasks.Task)
    def load(self, split: str = "test", data: str | os.PathLike | None = None, limit: int | None = None,
             skip_bad_rows: bool = False) -> list[Problem]:
        """`test`: the fixed held-out set (default 500 problems); `train`: the first `limit` (default 5000), seed 0.
        ``skip_bad_rows`` is accepted for the common signature: generated problems have no bad rows."""
        if data is not None:
            raise ValueError("arith is generated procedurally; it takes no `data` source")
        if split == "test":
            return self.test_set(limit or 500)
        if split == "train":
            stream = self.train_stream(0)
            return [next(stream) for _ in range(limit or 5000)]
        raise ValueError(f"arith split {split!r} is not defined; valid: test, train")

    def load_rows(self, split: str = "test", data: str | os.PathLike | None = None, limit: int | None = None,
                  skip_bad_rows: bool = False) -> tuple[list[Problem], SourceRows]:
        """As `load`; the source is ``generated`` (no rows were read, none skipped)."""
        return self.load(split, data, limit, skip_bad_rows), SourceRows(rows=[], where=[], source="generated")

    def train_pool(self, seed: int, size: int, *, data: str | os.PathLike | None = None,
                   skip_bad_rows: bool = False) -> list[Problem]:
        """The first `size` problems of ``train_stream(seed)`` (a new list; the problems drawn are kept in this
        process for the next run of the same difficulty and seed: a run's pool is thousands of problems, and a
        process that trains several runs, a pool worker of ``bench run`` or a notebook, drew them once)."""
        if data is not None:
            raise ValueError("arith is generated procedurally; it takes no `data` source")
        with _TRAIN_LOCK:  # (one stream per key: two threads must not draw from it at once)
            drawn, stream = _TRAIN_DRAWN.setdefault((self.difficulty, seed), ([], self.train_stream(seed)))
            if len(drawn) < size:
                drawn.extend(itertools.islice(stream, size - len(drawn)))
            return drawn[:size]

    def reward(self, completion: str, problem: Problem) -> float:
        """1.0 when the completion's final answer matches, else 0.0 (the GSM8K verifier)."""
        from evaluators.verify import is_correct

        return 1.0 if is_correct(completion, problem.answer, "number") else 0.0


#: (difficulty, seed) -> (the problems of its train stream drawn so far, the stream): problems are immutable and the
#: stream a pure function of its key, so a prefix drawn once is the prefix any later draw would give
_TRAIN_DRAWN: dict[tuple[int, int], tuple[list[Problem], Iterator[Problem]]] = {}
_TRAIN_LOCK = threading.Lock()


def _final(solution: str) -> int:
    return int(solution.rsplit("#### ", 1)[1])
