"""`bench train`'s progress: on a terminal a bar on stderr (step, reward, held-out accuracy, ETA); in a log file
plain lines on stdout (stderr stays for errors and a stopped run's one line): one per held-out evaluation and a status
line at most every ``POBENCH_PROGRESS_EVERY`` seconds (default 60). The engine calls ``step`` / ``evaluated`` through
its hooks (an engine without live steps, verl, shows evaluations only, after its job)."""

from __future__ import annotations

import sys
import time
from typing import Any

from bench.comparison.display import progress_every
from reports import metric_keys as K


class TrainProgress:
    def __init__(self, run: str, steps: int, enabled: bool = True, every: float | None = None) -> None:
        self.run, self.steps = run, steps
        self.live = enabled and sys.stderr.isatty()
        self.plain = enabled and not self.live
        self.every = progress_every() if every is None else every
        self.started = self.last = time.monotonic()
        self.reward = self.acc = float("nan")
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn(run), BarColumn(bar_width=24), MofNCompleteColumn(), TextColumn("steps ETA"),
                                TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                                console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task(run, total=steps, info="")

    def __enter__(self) -> TrainProgress:
        if self.live:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self.bar.__exit__(*exc)

    def _info(self) -> str:
        def f(x: float) -> str:
            return "-" if x != x else f"{x:.3f}"
        return f"reward {f(self.reward)}  held-out acc {f(self.acc)}"

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """``on_step``: after each training step."""
        self.reward = metrics.get(K.REWARD_MEAN, self.reward)
        if self.live:
            self.bar.update(self.task, completed=step, info=self._info())
        elif self.plain and time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            print(f"bench train: {self.run}: step {step}/{self.steps} after {self.last - self.started:.0f}s, "
                  f"{self._info()}", flush=True)

    def evaluated(self, step: int, metrics: dict[str, float]) -> None:
        """``on_eval``: after each held-out evaluation (step 0: before training)."""
        self.acc = metrics.get(K.EVAL_ACCURACY, self.acc)
        if self.live:
            self.bar.update(self.task, info=self._info())
        elif self.plain:
            print(f"bench train: {self.run}: held-out accuracy {self.acc:.4f} at step {step}", flush=True)
