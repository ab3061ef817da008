"""Shared data types of the evaluators: one `Problem` per benchmark row, whatever its source format."""

from __future__ import annotations

from dataclasses import dataclass


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
