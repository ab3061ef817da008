"""``TuneSpec``: everything one `bench tune` worker needs (the study loop, study.py, and its MLflow runs, runs.py,
read it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.config import TrainConfig
from bench.tune.metric import TuneMetric
from bench.tune.space import Range


@dataclass
class TuneSpec:
    """Everything one `bench tune` worker needs."""

    algo: str
    base: TrainConfig
    space: dict[str, Range]
    metric: TuneMetric
    study: str
    trials: int = 30
    seeds: list[int] = field(default_factory=lambda: [0])
    storage: str | None = None              # None: default_storage_url()
    pruner: str = "median"
    pruner_warmup: int = 1
    pruner_startup: int = 2
    heartbeat: int = 30
    grace: int | None = None
    max_retry: int = 3
    sampler_seed: int | None = None
    # trains one config: train_fn(cfg, on_eval=...) -> TrainResult (None: bench.engines.entry.train); a module-level
    # function, so that it reaches the pool's processes and Ray tasks (as ``ComparisonSpec.train_fn``)
    train_fn: Callable[..., Any] | None = field(default=None, compare=False)

    def fingerprint(self) -> dict[str, str]:
        """What must match when a worker joins or resumes an existing study."""
        return {"algo": self.algo, "metric": self.metric.spec, "direction": self.metric.direction,
                "seeds": ",".join(map(str, self.seeds)), "steps": str(self.base.steps),
                "space": ",".join(f"{n}={r.describe()}" for n, r in sorted(self.space.items())),
                "config_hash": self.base.comparison_hash()}
