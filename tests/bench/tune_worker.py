"""A `bench tune` worker with a cheap stand-in for the training loop, for the storage-mechanics tests.

Everything but the training is real (Optuna storage with heartbeats, pruner, MLflow runs): ``fake_train`` has the
signature and early-stop contract of ``bench.engines.train`` but produces a held-out accuracy curve from the sampled
``kl_coef`` in ``step_s`` seconds per step instead of training a model. Used by tests/bench/test_tune.py in-process
and as a subprocess (``python tests/bench/tune_worker.py --storage URL ...``) for the multi-worker and killed-worker
tests. See docs/TUNING.md.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, when run as a script


def curve_for(kl_coef: float, steps: int) -> list[float]:
    """A deterministic accuracy curve peaking for kl_coef = 1e-2 (so the search has something to find)."""
    quality = max(0.0, 1.0 - abs(math.log10(kl_coef) + 2.0) / 2.0)
    return [round(0.1 + 0.8 * quality * s / max(steps, 1), 6) for s in range(steps + 1)]


def fake_train(cfg, on_eval=None, step_s: float = 0.0, curve: list[float] | None = None):
    """Stand-in for ``bench.engines.train``: evaluates at every step of ``curve`` (default ``curve_for``)."""
    from bench.engines import StopTraining

    values = curve if curve is not None else curve_for(cfg.objective_overrides["kl_coef"], cfg.steps)
    metrics = {}
    for step, acc in enumerate(values):
        if step and step_s:
            time.sleep(step_s)
        metrics = {"eval/accuracy": acc, "eval/accuracy_sampled": acc / 2, "time/elapsed_s": step * step_s}
        try:
            if on_eval is not None:
                on_eval(step, metrics)
        except StopTraining:
            return SimpleNamespace(run_id=None, final_eval=metrics, steps_done=step)
    return SimpleNamespace(run_id=None, final_eval=metrics, steps_done=len(values) - 1)


def make_spec(study: str, storage: str, tracking_uri: str, experiment: str, trials: int, steps: int,
              heartbeat: int = 30, grace: int | None = None, pruner: str = "median", space: str | None = None,
              metric: str = "eval/accuracy", seeds: tuple[int, ...] = (0,)):
    from bench import tune
    from bench.config import TrainConfig

    base = TrainConfig(algo="tepo", steps=steps, eval_every=1, tracking_uri=tracking_uri, experiment=experiment)
    return tune.TuneSpec(algo="tepo", base=base, space=tune.resolve_space("tepo", space), study=study,
                         metric=tune.parse_metric(metric), trials=trials, seeds=list(seeds), storage=storage,
                         pruner=pruner, heartbeat=heartbeat, grace=grace)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--tracking-uri", required=True)
    p.add_argument("--experiment", required=True)
    p.add_argument("--study", required=True)
    p.add_argument("--trials", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--heartbeat", type=int, default=1)
    p.add_argument("--grace", type=int, default=3)
    p.add_argument("--pruner", default="none")
    p.add_argument("--barrier", help="after the imports, touch BARRIER.ready.<pid> and wait until BARRIER exists "
                                     "(so that several workers start their trials together)")
    a = p.parse_args()
    from bench import tune

    if a.barrier:
        Path(f"{a.barrier}.ready.{os.getpid()}").touch()
        deadline = time.time() + 300
        while not Path(a.barrier).exists():
            if time.time() > deadline:
                raise SystemExit("barrier never opened")
            time.sleep(0.1)

    spec = make_spec(a.study, a.storage, a.tracking_uri, a.experiment, a.trials, a.steps, a.heartbeat, a.grace,
                     a.pruner)
    pid = os.getpid()
    tune.run_study(spec, train_fn=lambda cfg, on_eval=None: fake_train(cfg, on_eval, a.step_s),
                   log=lambda msg: print(f"[{pid}] {msg}", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
