"""``--engine verl`` of `bench train` / `bench run`: one (objective, seed) pair trained by verl, recorded as a native
run is (same tags, params and metric names: bench/runs/lifecycle.py, ``launch.METRIC_MAP``).

verl runs as its own job (``python -m verl.trainer.main_ppo`` on a Ray cluster, GPUs): pobench waits for it, then
copies its metrics under pobench's names and hands the held-out evaluations to ``on_eval`` afterwards, in step order.
So what a native run does DURING training cannot happen here, and is refused or stated: no early stop (a
``StopTraining`` from ``on_eval`` is ignored: an Optuna pruner cannot prune a verl trial), no ``on_step`` progress,
no ``--resume`` (refused: verl would resume its checkpoint, but the rest would land in a new MLflow run). Pairs of
`bench run` run one at a time in this process (each job takes the Ray cluster it is given): ``--workers`` above 1
and ``--executor ray`` are refused with this engine. ``VerlEngine.capabilities`` (bench/engines/base.py) declares
all of this to the callers.
Options verl needs and ``TrainConfig`` lacks come in ``engine_args`` (the fields of ``VerlOptions``), among them
``python``: the interpreter of the environment verl is installed in (verl pins transformers < 5.11).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from bench.config import TrainConfig
from bench.engines.base import CAPABILITIES, Hooks, StopTraining, TrainResult, VerlOptions, check_engine_args
from bench.engines.verl.config import make_verl_config
from bench.engines.verl.launch import launch_run
from reports import metric_keys as K
from reports.record import open_client


def options_from(engine_args: dict) -> VerlOptions:
    """``engine_args`` of an ``engine: verl`` config as ``VerlOptions``; an unknown key is named with the valid ones."""
    check_engine_args("verl", engine_args)
    return VerlOptions(**engine_args)


def check_installed(python: str) -> None:
    """Refuse, in one line, an interpreter that cannot import verl (before any data or MLflow run is written)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('verl') is None)"
    if python == sys.executable:
        missing = importlib.util.find_spec("verl") is None
    else:
        try:
            missing = subprocess.call([python, "-c", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) != 0
        except OSError as e:
            raise ValueError(f"--engine verl: engine_args python={python!r} cannot be run: {e}") from None
    if missing:
        raise ValueError(f"--engine verl: verl is not installed for {python}. verl 0.9.1 pins transformers < 5.11, so "
                         "it lives in an environment of its own: `pip install verl==0.9.1` there and name its "
                         "interpreter in engine_args {python: /path/to/bin/python} (docs/SCALE.md, 'verl engine')")


def eval_points(client, run_id: str) -> dict[int, dict[str, float]]:
    """step -> the held-out metrics (``eval/*``) of a translated verl run at that step, with ``time/elapsed_s`` of
    that step (the training time up to it, as the native loop reports it; 0 before the first step)."""
    run = client.get_run(run_id)
    out: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        if key.startswith("eval/"):
            for m in client.get_metric_history(run_id, key):
                out.setdefault(m.step, {})[key] = m.value
    elapsed = sorted((m.step, m.value) for m in client.get_metric_history(run_id, K.ELAPSED_S))
    for step, metrics in out.items():
        metrics[K.ELAPSED_S] = max((v for s, v in elapsed if s <= step), default=0.0)
    return out


def check_options(cfg) -> VerlOptions:
    """What `bench train` / `bench run` check before any work starts: the options, verl's own refusals
    (``make_verl_config``: objective, model, task, schedule, batch shape), and that the interpreter imports verl."""
    options = options_from(cfg.engine_args)
    if cfg.resume:
        raise ValueError("--engine verl: --resume is not supported: verl resumes its own checkpoints, but pobench "
                         "would record the rest in a new MLflow run; train the pair again")
    make_verl_config(cfg, options)
    check_installed(options.python or sys.executable)
    return options


def train(cfg: TrainConfig, hooks: Hooks | None = None) -> TrainResult:
    """Train ``cfg`` on verl (``launch.launch_run``). Raises RuntimeError when verl exits with an error (the MLflow run
    is FAILED with the exit code in ``pobench.failure``). Of ``hooks`` only ``on_eval`` is called, after the job, in
    step order (no live steps; verl evaluates the starting policy itself: val_before_train)."""
    hooks = hooks or Hooks()
    options = check_options(cfg)
    rc, run_id = launch_run(cfg, options)
    if rc:
        raise RuntimeError(f"verl exited with {rc} (MLflow run {run_id}: its log is verl's console output)")
    client = open_client(cfg.tracking_uri)
    evals = eval_points(client, run_id)
    final: dict[str, float] = {}
    for step in sorted(evals):
        final = {k: v for k, v in evals[step].items() if k.startswith("eval/")}
        try:
            hooks.eval(step, dict(evals[step]))
        except StopTraining:  # too late to stop: the run has finished (module doc)
            pass
    return TrainResult(run_id, cfg.steps, cfg.run_dir(), final, False)


class VerlEngine:
    """verl's trainer on a Ray cluster (module doc)."""

    name = "verl"
    capabilities = CAPABILITIES[name]

    def check(self, cfg: TrainConfig) -> None:
        check_options(cfg)

    def train(self, cfg: TrainConfig, hooks: Hooks) -> TrainResult:
        return train(cfg, hooks)
