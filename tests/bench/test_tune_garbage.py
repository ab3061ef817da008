"""A study's garbage collections after each trial (Optuna's ``gc_after_trial``) look at the trials' objects only: the
process's heap from before the study is frozen while it runs (``bench.tune.heap.trial_garbage_only``)."""

from __future__ import annotations

import gc
import weakref

from bench import tune
from tests.bench.tune_worker import fake_train, make_spec
from tests.conftest import fresh_store


class _Cycle:
    """A trial's garbage that only a collection frees (a trained model's graph holds such cycles)."""

    def __init__(self) -> None:
        self.me = self


def _study(tmp_path, train) -> None:
    spec = make_spec("gc", f"sqlite:///{tmp_path}/o.db", fresh_store(tmp_path), "gc", trials=3, steps=2,
                     pruner="none")
    was_enabled = gc.isenabled()
    gc.disable()  # (only the study's own collections run: what they free is theirs)
    try:
        tune.run_study(spec, train_fn=train, log=lambda m: None)
    finally:
        if was_enabled:
            gc.enable()


def test_each_trials_garbage_is_collected_and_the_heap_before_the_study_is_not_walked(tmp_path):
    cycles: list[weakref.ref] = []
    seen: list[tuple[bool, int, int]] = []  # at each trial's start: an earlier trial's cycle alive, frozen, walked

    def train(cfg, on_eval=None):
        seen.append((any(r() is not None for r in cycles), gc.get_freeze_count(), len(gc.get_objects())))
        cycles.append(weakref.ref(_Cycle()))
        return fake_train(cfg, on_eval)

    heap = len(gc.get_objects())
    frozen = gc.get_freeze_count()
    _study(tmp_path, train)
    assert len(seen) == 3 and not any(alive for alive, _, _ in seen), seen  # each collected before the next trial
    assert cycles[-1]() is None  # and the last one's at its end
    # the objects from before the study are not walked by its collections (a full one is ~0.3 CPU-s in a process
    # that imported pobench's libraries), and are the collector's again afterwards
    assert all(n_frozen >= heap // 2 and walked < heap // 2 for _, n_frozen, walked in seen), (heap, seen)
    assert gc.get_freeze_count() == frozen == 0


def test_a_process_that_froze_its_heap_keeps_it_frozen(tmp_path):
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        cycles: list[weakref.ref] = []

        def train(cfg, on_eval=None):
            cycles.append(weakref.ref(_Cycle()))
            return fake_train(cfg, on_eval)

        _study(tmp_path, train)
        assert gc.get_freeze_count() > frozen // 2  # (not given back to the collector by the study)
        assert cycles and all(r() is None for r in cycles)
    finally:
        gc.unfreeze()
