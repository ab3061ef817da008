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
and ``get_engine`` imports an engine's module when it is asked for (verl's package also registers pobench's losses
with verl, where installed, on import).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from bench.config import TrainConfig

__all__ = ["CAPABILITIES", "ENGINES", "Capabilities", "Hooks", "RunStopped", "StopTraining", "TrainResult",
           "TrainingDiverged", "TrainingEngine", "check", "engine_for", "get_engine", "train"]


def get_engine(name: str) -> TrainingEngine:
    """The training engine called ``name`` (``ENGINES``)."""
    if name == "native":
        from bench.engines.native.loop import NativeEngine

        return NativeEngine()
    if name == "trl":
        from bench.engines.trl.run import TRLEngine

        return TRLEngine()
    if name == "verl":
        from bench.engines.verl.run import VerlEngine

        return VerlEngine()
    raise ValueError(f"unknown training engine {name!r}; valid: {', '.join(ENGINES)}")


def engine_for(cfg: TrainConfig) -> TrainingEngine:
    """The engine that trains ``cfg``."""
    return get_engine(cfg.engine)


def check(cfg: TrainConfig) -> None:
    """Refuse, before any work starts, a config that is invalid or that its engine cannot train: ValueError naming
    the cause (``TrainConfig.validate``, then the engine's ``check``)."""
    cfg.validate()
    engine_for(cfg).check(cfg)


def train(cfg: TrainConfig, *, on_eval: EvalHook | None = None, on_step: EvalHook | None = None,
          step0_eval: dict[str, float] | None = None) -> TrainResult:
    """Train ``cfg`` with its engine. ``on_eval(step, eval_metrics)`` after each held-out evaluation (may raise
    ``StopTraining``), ``on_step(step, metrics)`` after each training step, ``step0_eval``: the step-0 held-out
    metrics computed already (``Hooks``); what an engine cannot honour is stated by its ``Capabilities``."""
    cfg.validate()
    return engine_for(cfg).train(cfg, Hooks(on_eval, on_step, step0_eval))
