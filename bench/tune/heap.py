"""The garbage collections of a study: the trials' objects only (:func:`trial_garbage_only`)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def trial_garbage_only() -> Iterator[None]:
    """Inside, a garbage collection looks only at the objects made since the block began: those of the trials.
    Optuna collects after each trial (``gc_after_trial``: a trained model's reference cycles freed before the next
    trial builds its own); a full collection walks every object of the process (its imported libraries: about half
    a million objects, 0.3 CPU-seconds each time), the objects here before the study are frozen
    (``gc.freeze``) for its length and given back to the collector at its end. A process that froze its heap itself
    keeps its own arrangement."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
