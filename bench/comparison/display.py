"""The live display of `bench run`: an overall bar with ETA, and one line per pair being trained (step, reward,
held-out accuracy); messages (a pair waiting for another process, a failure) are printed above it. Where the output
is no terminal (a log file, a scheduler's output), plain lines on stdout instead: one per pair started, a status line
at most every ``every`` seconds (``POBENCH_PROGRESS_EVERY``, default 60), the outcome of each pair as before."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from bench.comparison.plan import Pair


class LiveDisplay:
    """Rich live progress: an overall bar with ETA, and one line per pair being trained (step, reward, held-out
    accuracy); messages (a pair waiting for another process, a failure) are printed above it."""

    def __init__(self, cid: str, pairs: list[Pair], steps: int, enabled: bool, workers: int = 1,
                 every: float | None = None) -> None:
        self.plain = enabled and not sys.stdout.isatty()  # a log file: plain lines, no live redraws
        self.enabled = enabled and not self.plain
        self.cid = cid
        self.every = progress_every() if every is None else every
        self.started = self.last = time.monotonic()
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
        """``notify`` of bench.comparison.pairs: start / step / eval / msg events of pair ``i`` (-1: the comparison)."""
        if kind == "msg":
            self.print(f"  {payload[0]}")  # messages name their pair
            return
        if kind == "start":
            p = self.todo[i]
            if self.plain:
                what = "resuming" if payload[0] == "resume" else "training"
                print(f"  [{i + 1}/{len(self.todo)}] {what} {p.variant} seed {p.seed}", flush=True)
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
        if self.plain and time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            running = ", ".join(f"{self.todo[j].variant} s{self.todo[j].seed} step {self.at[j]}/{self.steps} "
                                f"({self._info(j)})" for j in range(len(self.todo)) if 0 < self.at[j] < self.steps)
            print(f"  comparison {self.cid}: {sum(self.at)}/{len(self.todo) * self.steps} steps after "
                  f"{self.last - self.started:.0f}s" + (f"; {running}" if running else ""), flush=True)
        if self.enabled:
            if i in self.tasks:
                self.progress.update(self.tasks[i], completed=step, info=self._info(i))
            self.progress.update(self.overall, completed=sum(self.at))

    def done(self, i: int, p: Pair, error: str = "") -> None:
        self.print(f"  {p.variant} seed {p.seed}: {p.outcome}" + (f" (run {p.run_id})" if p.run_id else ""))
        if error and not p.outcome.startswith("failed: step"):  # a divergence needs no traceback
            self.print(error.rstrip())
        self._at(i, self.steps)
        if self.enabled and i in self.tasks:
            self.progress.remove_task(self.tasks.pop(i))


def progress_every() -> float:
    """Seconds between two status lines where the output is a log file: ``POBENCH_PROGRESS_EVERY`` (default 60)."""
    raw = os.environ.get("POBENCH_PROGRESS_EVERY", "60")
    try:
        every = float(raw)
    except ValueError:
        raise ValueError(f"POBENCH_PROGRESS_EVERY={raw!r}: give a number of seconds") from None
    if not every >= 0:
        raise ValueError(f"POBENCH_PROGRESS_EVERY={raw!r}: give a number of seconds >= 0")
    return every
