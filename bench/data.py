"""Training and held-out problems for a run, in an order that is a pure function of (seed, step, round), and
``derive_seed``, which makes every random draw of a run such a function.

Every objective of a comparison therefore sees exactly the same prompts at every step (refill rounds of dynamic
sampling draw from their own deterministic sub-stream, so they never shift the main order), and a resumed run sees
the prompts it would have seen without interruption.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from evaluators import Task, get_task
from evaluators.tasks import Problem


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any tuple: every random draw of a run is a pure function of (seed, step, ...)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


class TrainData:
    """The prompt source of one run."""

    def __init__(self, task: str, *, seed: int, steps: int, prompts_per_step: int, data: str | None = None,
                 difficulty: int = 2, skip_bad_rows: bool = False) -> None:
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self.task = get_task(task, difficulty=difficulty)
        if self.task.generated and data is not None:
            raise ValueError(f"task {task} is generated procedurally; it takes no --data")
        # a generated task: the first steps * P + 4096 problems of its seed's stream; a file task: its whole train
        # split, shuffled by the seed
        self.pool: list[Problem] = list(self.task.train_pool(seed, steps * prompts_per_step + 4096, data=data,
                                                                  skip_bad_rows=skip_bad_rows))
        if not self.pool:
            raise ValueError(f"task {task}: the training split is empty")

    def batch(self, step: int, round_: int = 0) -> list[Problem]:
        """Prompts of `step` (1-based); `round_` > 0 are dynamic-sampling refills."""
        n, P = len(self.pool), self.prompts_per_step
        if round_ == 0:
            start = (step - 1) * P
            return [self.pool[(start + i) % n] for i in range(P)]
        rng = random.Random(f"pobench-refill-{self.seed}-{step}-{round_}")
        return [self.pool[i] for i in rng.sample(range(n), min(P, n))]


def eval_problems(task: str, *, limit: int, data: str | None = None, difficulty: int = 2,
                  skip_bad_rows: bool = False) -> tuple[Task, list[Problem]]:
    """(task, held-out problems) for periodic evaluation."""
    held_out = get_task(task, difficulty=difficulty)
    problems = held_out.load(split="test", data=data, limit=limit, skip_bad_rows=skip_bad_rows)
    if not problems:
        raise ValueError(f"held-out task {task}: no problems loaded")
    return held_out, problems
