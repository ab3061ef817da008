"""Launch of one run on verl and the MLflow record it leaves (part 3 of the package docstring)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from mlflow.entities import Metric

from algorithms import get_objective
from bench.engines.base import VerlOptions
from bench.engines.verl.config import main_ppo_command, make_verl_config, write_data
from bench.runs.run import Run, run_tags_and_params
from reports import metric_keys as K
from reports import record
from reports.record import ENGINE

# ------------------------------------------------------------------------------------------------ MLflow
#: verl metric -> pobench metric (docs/METRICS.md), copied into the run after it ends by ``translate_metrics``
METRIC_MAP = {
    "critic/score/mean": K.REWARD_MEAN,
    "response_length/mean": K.LENGTH_MEAN,
    "response_length/max": K.LENGTH_MAX,
    "response_length/clip_ratio": K.TRUNCATION_RATE,
    "actor/entropy": K.ENTROPY_MEAN,
    "actor/pg_loss": K.POLICY_LOSS,
    "actor/grad_norm": K.GRAD_NORM,
    "actor/lr": K.LR,
    "actor/kl_loss": K.KL_REF,
    "timing_s/gen": K.ROLLOUT_S,
    "timing_s/update_actor": K.UPDATE_S,
    "timing_s/step": K.STEP_S,
    "perf/total_num_tokens": K.TOTAL_NUM_TOKENS,
    "perf/throughput": K.THROUGHPUT,
}
ENGINE_TAGS = {ENGINE: "verl"}
#: validation metrics: val-core/<data_source>/acc/mean@1 -> eval/accuracy (greedy when eval_temperature = 0). MLflow
#: refuses "@" in a metric name: verl's MLflow logger writes it as "_at_" (verl/utils/tracking.py, _sanitize_key)
VAL_PATTERN = re.compile(r"^val-core/(?P<source>[^/]+)/acc/mean(?:@|_at_)(?P<n>\d+)$")


def pobench_tags(cfg) -> dict[str, str]:
    """The tags of a verl-trained run: every engine's (bench/runs/lifecycle.py), with ``pobench.engine=verl``."""
    return run_tags_and_params(cfg, get_objective(cfg.algo, **cfg.objective_overrides), ENGINE_TAGS)[0]


def translate_metrics(client, run_id: str, eval_source: str | None = None) -> int:
    """Copy verl's metrics of ``run_id`` under pobench's names (METRIC_MAP, VAL_PATTERN); also ``time/elapsed_s``
    (cumulative ``time/step_s``). Returns the number of points written."""
    run = client.get_run(run_id)
    points: list[Metric] = []
    for key in run.data.metrics:
        target = METRIC_MAP.get(key)
        m = VAL_PATTERN.match(key)
        if m and (eval_source is None or m["source"] == eval_source):
            target = K.EVAL_ACCURACY if m["n"] == "1" else K.EVAL_ACCURACY_SAMPLED
        if target is None:
            continue
        history = sorted(client.get_metric_history(run_id, key), key=lambda x: x.step)
        points += [Metric(target, h.value, h.timestamp, h.step) for h in history]
        if target == K.STEP_S:
            total = 0.0
            for h in history:
                total += h.value
                points.append(Metric(K.ELAPSED_S, total, h.timestamp, h.step))
    record.log_batch(client, run_id, metrics=points)  # (split by MLflow's limits there)
    return len(points)


# ------------------------------------------------------------------------------------------------ launch
def launch(cfg, options: VerlOptions | None = None, *, dry_run: bool = False, python: str | None = None) -> int:
    """Run one (objective, seed) of a comparison on verl (needs verl, GPUs, and a Ray cluster: ``RAY_ADDRESS`` or a
    local one). Writes the parquet data, creates the MLflow run with pobench's tags, runs ``verl.trainer.main_ppo``
    attached to it (``MLFLOW_RUN_ID``), then copies verl's metrics under pobench's names. Returns verl's exit code.
    ``dry_run``: print the command instead of running anything. ``python``: the interpreter that runs verl (default:
    ``options.python``, else this one)."""
    if dry_run:
        print(shlex.join(main_ppo_command(make_verl_config(cfg, options), verl_python(options, python))))
        return 0
    return launch_run(cfg, options, python=python)[0]


def verl_python(options: VerlOptions | None, python: str | None = None) -> str:
    return python or (options.python if options is not None else None) or sys.executable


def launch_run(cfg, options: VerlOptions | None = None, *, python: str | None = None) -> tuple[int, str]:
    """``launch``, returning (verl's exit code, the MLflow run id). The run's record is every engine's
    (bench/runs/run.py): Ctrl-C / SIGTERM while verl runs stops verl and ends the run KILLED; a failed
    translation ends it FAILED; a non-zero exit of verl ends it FAILED with the code in ``pobench.failure``."""
    config = make_verl_config(cfg, options)
    objective = get_objective(cfg.algo, **cfg.objective_overrides)
    run = Run.enter(cfg, objective, seed=False)  # created and marked as pobench's before anything is written into it
    write_data(cfg, Path(config["data"]["train_files"]).parent)
    logger = run.open(tags=ENGINE_TAGS)
    run_id = logger.run_id
    with run.recorded():  # (at once: no code between the open run and its guard)
        env_vars = config["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
        env_vars.update({"MLFLOW_TRACKING_URI": logger.uri, "MLFLOW_RUN_ID": run_id})
        command = main_ppo_command(config, verl_python(options, python))
        env = {**os.environ, **env_vars}
        if os.environ.get("PYTHONPATH"):  # pobench's source tree first, then what the user had
            env["PYTHONPATH"] = os.pathsep.join([env_vars["PYTHONPATH"], os.environ["PYTHONPATH"]])
        proc = subprocess.Popen(command, env=env, pass_fds=run.lock_fds())  # (verl holds the folder too)
        try:
            rc = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        translate_metrics(logger.client, run_id, eval_source=cfg.eval_task or cfg.task)
        run.end(f"verl main_ppo exited with {rc}" if rc else None)  # (inside: an end that fails is recorded)
    return rc, run_id
