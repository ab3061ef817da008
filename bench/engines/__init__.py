"""Training engines: the one place that picks the engine of a run (``get_engine``, ``engine_for``), and ``train`` /
``check``, what `bench train`, `bench run` and `bench tune` call.

- ``base.py``: the interface: ``TrainingEngine``, ``Capabilities`` (what callers ask instead of an engine's name),
  ``Hooks``, ``TrainResult``, ``StopTraining``, ``TrainingDiverged``, ``RunStopped``, the ``engine_args`` each
  engine takes;
- ``lifecycle.py``: the life of a run, the same for every engine: folder, seed, MLflow run opened or reopened,
  SIGTERM, its end;
- ``stats.py``: the per-step training statistics (rollout summary, loss accumulation, KL, drift);
- ``native/``: pobench's own loop (``NativeEngine``); ``trl/``: TRL's ``GRPOTrainer`` with pobench's objectives
  (``TRLEngine``); ``verl/``: verl's trainer on Ray with pobench's objectives (``VerlEngine``).

``bench.config`` reads the declarations of ``base`` (engine names, the ``engine_args`` each takes, those that leave
the comparison hash), and every engine imports ``bench.config``: so this package's ``__init__`` imports ``base`` only,
at any depth (no import circle through it, function-level imports counted: tests/test_layers.py), and the entry to
training lives in ``entry.py``: ``get_engine`` / ``engine_for`` (which imports an engine's module when it is asked
for: verl's package also registers pobench's losses with verl, where installed, on import), ``check`` and ``train``.
"""

from __future__ import annotations

from bench.engines.base import (
    CAPABILITIES,
    ENGINES,
    Capabilities,
    EvalHook,
    Hooks,
    RunStopped,
    StopTraining,
    TrainingDiverged,
    TrainingEngine,
    TrainResult,
)

__all__ = ["CAPABILITIES", "ENGINES", "Capabilities", "EvalHook", "Hooks", "RunStopped", "StopTraining", "TrainResult",
           "TrainingDiverged", "TrainingEngine"]
