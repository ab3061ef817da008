"""The training-engine interface: what every engine declares (its capabilities, the ``engine_args`` it takes) and what
its ``train`` takes and returns.

An engine (``TrainingEngine``) trains ONE (objective, seed) run of a ``TrainConfig``: ``check(cfg)`` refuses, before any
work, what it cannot train; ``train(cfg, hooks)`` trains and returns a ``TrainResult``. Callers (``bench train``,
``bench run``, ``bench tune``) never branch on an engine's name: they ask its ``Capabilities``. The engines are
``native`` (pobench's own loop, bench/engines/native/), ``trl`` (bench/engines/trl/) and ``verl``
(bench/engines/verl/); ``bench.engines.entry.get_engine`` is the one place that picks one.

This module imports nothing of pobench (``bench.config.TrainConfig`` reads the declarations below to validate
``engine_args`` and to hash a comparison), so every module may import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

EvalHook = Callable[[int, dict[str, float]], None]


class StopTraining(Exception):
    """Raised by an ``on_eval`` hook to end a run early (e.g. an Optuna pruner); engines without ``early_stop``
    ignore it."""


class TrainingDiverged(RuntimeError):
    """A loss or gradient became NaN/inf. The run is marked FAILED; the last good step is checkpointed."""


class RunStopped(RuntimeError):
    """A fault outside the run stopped it (the MLflow server went away, the disk is full): one line saying the cause,
    what was kept and how the MLflow run was ended; the run can be resumed (`bench train` adds the command, exit 1).
    ``damaged_store``: the MLflow store that was found damaged (its record of the run lost with it unless restored:
    `bench train` then names both ways on, bench/cli/train.py), else None."""

    damaged_store: str | None = None
    #: the parts of a run's line (``bench.runs.lifecycle.stopped``), for a command whose way on is not a resume of the
    #: run (`bench tune`: a rerun goes on with the study): the cause, how its MLflow run was ended; None otherwise
    cause: str | None = None
    run_end: str | None = None


@dataclass
class Hooks:
    """What a caller hands to ``train`` besides the config."""

    on_eval: EvalHook | None = None  # after each held-out evaluation (step 0 = before training); may raise StopTraining
    on_step: EvalHook | None = None  # after each training step, with its metrics (progress displays)
    step0_eval: dict[str, float] | None = None  # step-0 held-out metrics computed already for this exact policy and
    # evaluation (`bench run` evaluates the shared starting policy once per comparison): logged instead of evaluating

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        if self.on_eval is not None:
            self.on_eval(step, metrics)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        if self.on_step is not None:
            self.on_step(step, metrics)


@dataclass
class TrainResult:
    run_id: str
    steps_done: int
    output_dir: Path
    final_eval: dict[str, float] = field(default_factory=dict)
    stopped_early: bool = False


# ------------------------------------------------------------------ engine_args
@dataclass
class NoOptions:
    """The native loop takes no ``engine_args``."""


@dataclass
class VerlOptions:
    """What verl needs that pobench's TrainConfig does not say (the cluster, the rollout engine's sharding)."""

    rollout_engine: str = "vllm"  # vllm | sglang
    nnodes: int = 1
    n_gpus_per_node: int = 8
    tensor_parallel: int = 1  # rollout tensor-parallel size
    gpu_memory_utilization: float = 0.5
    max_prompt_length: int = 1024
    data_dir: str | None = None  # where write_data puts the parquet files (default: <output_dir>/<run>/verl-data)
    python: str | None = None  # the interpreter that runs verl (default: this one); verl pins transformers < 5.11, so
    # it often lives in an environment of its own: e.g. /opt/verl/bin/python


# ------------------------------------------------------------------ capabilities
@dataclass(frozen=True)
class Capabilities:
    """What an engine does, so that callers ask instead of naming it."""

    live_steps: bool       # hooks.on_step is called during training, after every step
    early_stop: bool       # a StopTraining raised by hooks.on_eval ends the run early (Optuna pruning)
    resume: bool           # cfg.resume continues a checkpointed run in the same MLflow run
    parallel_pairs: bool   # several runs may train at once from one `bench run` / `bench tune` (workers, Ray tasks)
    step0_eval: bool       # takes hooks.step0_eval, computed in this process with the rollout sampler
    options: type | None   # the dataclass of the engine_args it takes; None: checked by the engine's check()
    hash_free_args: tuple[str, ...] = ()  # engine_args that change no result: left out of the comparison hash


DEFAULT_ENGINE = "native"
CAPABILITIES: dict[str, Capabilities] = {
    "native": Capabilities(live_steps=True, early_stop=True, resume=True, parallel_pairs=True, step0_eval=True,
                           options=NoOptions),
    # TRL: GRPOConfig fields (bench/engines/trl/support.py checks them)
    "trl": Capabilities(live_steps=True, early_stop=True, resume=True, parallel_pairs=True, step0_eval=True,
                        options=None),
    # verl runs as its own job on a Ray cluster and hands the evaluations over after it ended (verl/run.py)
    "verl": Capabilities(live_steps=False, early_stop=False, resume=False, parallel_pairs=False, step0_eval=False,
                         options=VerlOptions, hash_free_args=("python", "data_dir")),
}
ENGINES = tuple(CAPABILITIES)


def check_engine_args(engine: str, engine_args: dict) -> None:
    """ValueError naming the keys of ``engine_args`` that ``engine`` does not take, with the valid ones."""
    options = CAPABILITIES[engine].options
    if options is None:
        return
    valid = {f.name for f in dataclasses.fields(options)}
    if engine_args and not valid:
        raise ValueError(f"the {engine} engine takes no engine_args")
    unknown = sorted(set(engine_args) - valid)
    if unknown:
        raise ValueError(f"engine_args {', '.join(unknown)}: not an option of the {engine} engine (valid: "
                         f"{', '.join(sorted(valid))})")


class TrainingEngine(Protocol):
    """One way of training a run (``NativeEngine``, ``TRLEngine``, ``VerlEngine``)."""

    name: str
    capabilities: Capabilities

    def check(self, cfg: Any) -> None:
        """Refuse, before any work starts, what this engine cannot train (``cfg``: a ``bench.config.TrainConfig``,
        which imports this module): ValueError naming the cause."""
        ...

    def train(self, cfg: Any, hooks: Hooks) -> TrainResult:
        """Train ``cfg`` (checked first); log to MLflow through bench/runs/lifecycle.py; return the result."""
        ...
