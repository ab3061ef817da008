"""'did you mean' suggestions for a name that is not among the known ones (objectives, benchmarks, config fields).

Standard library only, so every package can use it (``algorithms`` imports nothing else from ``evaluators``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, options: Iterable[str], *, cutoff: float = 0.6, quote: bool = True) -> str:
    """``" (did you mean 'x'?)"`` naming the closest of ``options`` (``difflib``, similarity >= ``cutoff``), or ``""``
    when none is close. ``quote=False`` names it without quotes."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=cutoff)
    if not close:
        return ""
    return f" (did you mean {close[0]!r}?)" if quote else f" (did you mean {close[0]}?)"
