"""A stand-in for the training itself, for the orchestration tests of `bench run` (bench/comparison/): its plan, reuse,
resume, ``--force``, failures, Ctrl-C and executors are the same whatever trains, so these tests inject this trainer
(``ComparisonSpec(train_fn=fake_train, step0_fn=fake_step0)``) and run in seconds; tests/bench/test_train.py,
test_harness.py's end-to-end comparison and the Ray tests train for real.

Everything but the model is real: the run's MLflow record is written by bench/runs/lifecycle.py, as every engine's
(tags, params, config artifact; FINISHED / KILLED / FAILED), state-only checkpoints (bench/runs/checkpoint.py)
are what `bench run` resumes from, and the hooks are called as an engine calls them (an ``on_eval`` may raise
StopTraining, KeyboardInterrupt or an error). Its metrics are a pure function of (objective, overrides, seed, step),
so two executors must log the same numbers. ``$FAKE_STEP_S`` seconds per step (default 0) make it slow enough to
interrupt.

``python tests/bench/fake_trainer.py run|tune ARGS``: `bench run ARGS` / `bench tune ARGS` (the real command line)
with this trainer injected (``bench tune``: ``TuneSpec(train_fn=fake_train)``, which reaches its pool's processes).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, when run as a script

from algorithms import get_objective  # noqa: E402
from bench.engines import Hooks, StopTraining, TrainResult  # noqa: E402
from bench.runs import checkpoint  # noqa: E402
from bench.runs.lifecycle import finish_run, open_run, recorded, run_folder  # noqa: E402
from reports import metric_keys as K  # noqa: E402

FAKE_METRICS = {K.REWARD_MEAN, K.ELAPSED_S, K.EVAL_ACCURACY}  # all it logs


def value(cfg, what: str, step: int) -> float:
    """A number in [0, 1) that depends only on the run's identity and the step."""
    key = repr((cfg.algo, sorted(cfg.objective_overrides.items()), cfg.seed, what, step)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little") / 2**32


def fake_step0(cfg, seeds: list[int]) -> dict[int, dict[str, float]]:
    """The comparison's shared step-0 evaluation: one value per seed."""
    return {s: {K.EVAL_ACCURACY: 0.5 + s / 1000} for s in seeds}


def fake_train(cfg, *, on_eval=None, on_step=None, step0_eval=None, eval_fn=None) -> TrainResult:
    """``bench.engines.train``'s contract without a model (module doc). ``eval_fn(cfg, step)``: the held-out accuracy
    at a step (default ``value(cfg, "eval", step)``), for tests that need to know the numbers (bind it with
    ``functools.partial`` to a module-level function, which reaches a pool's processes)."""
    hooks = Hooks(on_eval, on_step, step0_eval)
    cfg.validate()
    objective = get_objective(cfg.algo, **cfg.objective_overrides)
    _, run_dir, last = run_folder(cfg)
    state = json.loads((last / "state.json").read_text()) if last is not None else None
    logger = open_run(cfg, objective, run_dir, resume_state=state)
    start, elapsed = (state["step"], state["elapsed"]) if state is not None else (0, 0.0)
    step_s = float(os.environ.get("FAKE_STEP_S", "0"))
    final: dict[str, float] = {}
    stopped = False
    step = start

    def evaluate(step: int, given: dict[str, float] | None = None) -> None:
        nonlocal final, stopped
        acc = eval_fn(cfg, step) if eval_fn is not None else value(cfg, "eval", step)
        final = dict(given) if given is not None else {K.EVAL_ACCURACY: acc}
        logger.log(final, step)
        try:
            hooks.eval(step, {**final, K.ELAPSED_S: elapsed})
        except StopTraining:
            stopped = True

    with recorded(logger):
        if start == 0 and cfg.eval_every > 0:
            evaluate(0, hooks.step0_eval)
        for step in range(start + 1, cfg.steps + 1 if not stopped else start + 1):
            time.sleep(step_s)
            elapsed += 1.0
            metrics = {K.REWARD_MEAN: value(cfg, "reward", step), K.ELAPSED_S: elapsed}
            logger.log(metrics, step)
            hooks.step(step, metrics)
            if cfg.eval_every > 0 and (step % cfg.eval_every == 0 or step == cfg.steps):
                evaluate(step)
            if stopped or step == cfg.steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                checkpoint.save_state(run_dir, step, {"run_id": logger.run_id, "pending": logger.pending,
                                                      "elapsed": elapsed}, keep=cfg.keep_checkpoints)
                logger.flush()
            if stopped:
                break
    finish_run(logger, stopped)
    return TrainResult(logger.run_id, step, run_dir, final, stopped)


def inject(set_attribute=setattr) -> None:
    """Make `bench run` train its comparison's pairs and `bench tune` its trials and confirm runs with
    ``fake_train`` (and ``fake_step0``): in this process (``set_attribute``: e.g. pytest's ``monkeypatch.setattr``,
    undone after the test) and, through the specs, in their pools' processes."""
    import dataclasses

    from bench import tune
    from bench.cli import run as run_command

    real_comparison, real_workers, real_confirm = run_command.run_comparison, tune.run_workers, tune.run_confirm

    def run_comparison(spec):
        return real_comparison(dataclasses.replace(spec, train_fn=fake_train, step0_fn=fake_step0))

    def run_workers(spec, *args, **kwargs):
        return real_workers(dataclasses.replace(spec, train_fn=fake_train), *args, **kwargs)

    def run_confirm(spec, *args, **kwargs):
        return real_confirm(dataclasses.replace(spec, train_fn=fake_train), *args, **kwargs)

    set_attribute(run_command, "run_comparison", run_comparison)  # (the names `bench run` and `bench tune` call)
    set_attribute(tune, "run_workers", run_workers)
    set_attribute(tune, "run_confirm", run_confirm)


def main(argv: list[str]) -> int:
    """`bench ARGV` (``bench.cli.entry``) with the fake trainer injected."""
    from bench.cli import entry

    inject()
    sys.argv = [sys.argv[0], *argv]
    entry()  # as `bench`: SIGINT / SIGTERM handlers, exit code (raises SystemExit)
    return 0


if __name__ == "__main__":  # (the module by its import name: its fake_train is what a pool's server preloads)
    from tests.bench import fake_trainer

    sys.exit(fake_trainer.main(sys.argv[1:]))
