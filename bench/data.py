"""Training and held-out problems for a run, in an order that is a pure function of (seed, step, round).

Every objective of a comparison therefore sees exactly the same prompts at every step (refill rounds of dynamic
sampling draw from their own deterministic sub-stream, so they never shift the main order), and a resumed run sees
the prompts it would have seen without interruption.
"""

from __future__ import annotations

import itertools
import random

from evaluators import get_benchmark
from evaluators.tasks import Problem


class TrainData:
    """The prompt source of one run."""

    def __init__(self, task: str, *, seed: int, steps: int, prompts_per_step: int, data: str | None = None,
                 difficulty: int = 2, skip_bad_rows: bool = False) -> None:
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self.benchmark = _benchmark(task, difficulty)
        if task == "arith":
            if data is not None:
                raise ValueError("task arith is generated procedurally; it takes no --data")
            stream = self.benchmark.train_stream(seed)
            self.pool: list[Problem] = list(itertools.islice(stream, steps * prompts_per_step + 4096))
        else:
            pool = self.benchmark.load(split="train", data=data, skip_bad_rows=skip_bad_rows)
            if not pool:
                raise ValueError(f"task {task}: the training split is empty")
            self.pool = list(pool)
            random.Random(f"pobench-data-{seed}").shuffle(self.pool)

    def batch(self, step: int, round_: int = 0) -> list[Problem]:
        """Prompts of `step` (1-based); `round_` > 0 are dynamic-sampling refills."""
        n, P = len(self.pool), self.prompts_per_step
        if round_ == 0:
            start = (step - 1) * P
            return [self.pool[(start + i) % n] for i in range(P)]
        rng = random.Random(f"pobench-refill-{self.seed}-{step}-{round_}")
        return [self.pool[i] for i in rng.sample(range(n), min(P, n))]


def _benchmark(task: str, difficulty: int):
    return get_benchmark(task, difficulty=difficulty) if task == "arith" else get_benchmark(task)


def eval_problems(task: str, *, limit: int, data: str | None = None, difficulty: int = 2,
                  skip_bad_rows: bool = False):
    """(benchmark, held-out problems) for periodic evaluation."""
    bench = _benchmark(task, difficulty)
    extra = {"skip_bad_rows": True} if skip_bad_rows and task != "arith" else {}  # arith is generated: no rows
    problems = bench.load(split="test", data=data, limit=limit, **extra)
    if not problems:
        raise ValueError(f"held-out task {task}: no problems loaded")
    return bench, problems
