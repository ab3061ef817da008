"""The live display of `bench run`: an overall bar with ETA, and one line per pair being trained (step, reward,
held-out accuracy); messages (a pair waiting for another process, a failure) are printed above it."""

from __future__ import annotations

import sys
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from bench.compare.plan import Pair


class LiveDisplay:
    """Rich live progress: an overall bar with ETA, and one line per pair being trained (step, reward, held-out
    accuracy); messages (a pair waiting for another process, a failure) are printed above it."""

    def __init__(self, cid: str, pairs: list[Pair], steps: int, enabled: bool, workers: int = 1) -> None:
        self.enabled = enabled
        self.todo = [p for p in pairs if p.action != "reuse"]
        self.steps = steps
        self.at = [0] * len(self.todo)
        self.info = [[float("nan"), float("nan")] for _ in self.todo]  # reward, held-out accuracy
        self.tasks: dict[int, Any] = {}
        self.err = sys.stderr
        if not enabled:
            return
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                                 TextColumn("steps"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[info]}"))
        reused = len(pairs) - len(self.todo)
        self.overall = self.progress.add_task(
            f"comparison {cid}", total=max(1, len(self.todo) * steps),
            info=f"{len(self.todo)} runs to do on {workers} worker{'s' if workers > 1 else ''}, {reused} reused")

    def __enter__(self):
        if self.enabled:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)

    def _info(self, i: int) -> str:
        r, a = self.info[i]
        return f"reward {'-' if r != r else f'{r:.3f}'}  held-out acc {'-' if a != a else f'{a:.3f}'}"

    def print(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.err)

    def event(self, kind: str, i: int, *payload: Any) -> None:
        """``notify`` of bench.compare.pairs: start / step / eval / msg events of pair ``i`` (-1: the comparison)."""
        if kind == "msg":
            self.print(f"  {payload[0]}")  # messages name their pair
            return
        if kind == "start":
            p = self.todo[i]
            if self.enabled:
                what = "resume" if payload[0] == "resume" else "train"
                self.tasks[i] = self.progress.add_task(f"[{i + 1}/{len(self.todo)}] {what} {p.variant} seed "
                                                       f"{p.seed}", total=self.steps, info=self._info(i))
            return
        step, value = payload
        self.info[i][0 if kind == "step" else 1] = value
        self._at(i, step)

    def _at(self, i: int, step: int) -> None:
        self.at[i] = step
        if self.enabled:
            if i in self.tasks:
                self.progress.update(self.tasks[i], completed=step, info=self._info(i))
            self.progress.update(self.overall, completed=sum(self.at))

    def done(self, i: int, p: Pair, error: str = "") -> None:
        self.print(f"  {p.variant} seed {p.seed}: {p.outcome} (run {p.run_id})")
        if error and not p.outcome.startswith("failed: step"):  # a divergence needs no traceback
            self.print(error.rstrip())
        self._at(i, self.steps)
        if self.enabled and i in self.tasks:
            self.progress.remove_task(self.tasks.pop(i))
