"""The entry to training, for `bench train`, `bench run` and `bench tune`: the engine of a run (``get_engine``,
``engine_for``: an engine's module is imported when it is asked for), ``check`` (before any work) and ``train``."""

from __future__ import annotations

from bench.config import TrainConfig
from bench.engines.base import ENGINES, EvalHook, Hooks, TrainingEngine, TrainResult


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
