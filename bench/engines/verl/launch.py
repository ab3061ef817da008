"""Launch of one run on verl and the MLflow record it leaves (part 3 of the package docstring)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from bench.engines.verl.config import VerlOptions, main_ppo_command, make_verl_config, run_name, write_data

# ------------------------------------------------------------------------------------------------ MLflow
#: verl metric -> pobench metric (docs/METRICS.md), copied into the run after it ends by ``translate_metrics``
METRIC_MAP = {
    "critic/score/mean": "rollout/reward_mean",
    "response_length/mean": "rollout/length_mean",
    "response_length/max": "rollout/length_max",
    "response_length/clip_ratio": "rollout/truncation_rate",
    "actor/entropy": "rollout/entropy_mean",
    "actor/pg_loss": "objective/policy_loss",
    "actor/grad_norm": "train/grad_norm",
    "actor/lr": "train/lr",
    "actor/kl_loss": "train/kl_ref",
    "timing_s/gen": "time/rollout_s",
    "timing_s/update_actor": "time/update_s",
    "timing_s/step": "time/step_s",
    "perf/total_num_tokens": "perf/total_num_tokens",
    "perf/throughput": "perf/throughput",
}
#: validation metrics: val-core/<data_source>/acc/mean@1 -> eval/accuracy (greedy when eval_temperature = 0). MLflow
#: refuses "@" in a metric name: verl's MLflow logger writes it as "_at_" (verl/utils/tracking.py, _sanitize_key)
VAL_PATTERN = re.compile(r"^val-core/(?P<source>[^/]+)/acc/mean(?:@|_at_)(?P<n>\d+)$")


def run_record(cfg) -> tuple[dict[str, str], dict[str, str]]:
    """The tags and params every engine gives a training run (bench/train.py ``run_tags_and_params``), with
    ``pobench.engine`` = ``verl``."""
    from algorithms import get_objective
    from bench.train import run_tags_and_params
    from reports.record import ENGINE

    tags, params = run_tags_and_params(cfg, get_objective(cfg.algo, **cfg.objective_overrides))
    return {**tags, ENGINE: "verl"}, params


def pobench_tags(cfg) -> dict[str, str]:
    """The tags of a verl-trained run (``run_record``)."""
    return run_record(cfg)[0]


def translate_metrics(client, run_id: str, eval_source: str | None = None) -> int:
    """Copy verl's metrics of ``run_id`` under pobench's names (METRIC_MAP, VAL_PATTERN); also ``time/elapsed_s``
    (cumulative ``time/step_s``). Returns the number of points written."""
    from mlflow.entities import Metric

    from reports import record

    run = client.get_run(run_id)
    points: list[Metric] = []
    for key in run.data.metrics:
        target = METRIC_MAP.get(key)
        m = VAL_PATTERN.match(key)
        if m and (eval_source is None or m["source"] == eval_source):
            target = "eval/accuracy" if m["n"] == "1" else "eval/accuracy_sampled"
        if target is None:
            continue
        history = sorted(client.get_metric_history(run_id, key), key=lambda x: x.step)
        points += [Metric(target, h.value, h.timestamp, h.step) for h in history]
        if target == "time/step_s":
            total = 0.0
            for h in history:
                total += h.value
                points.append(Metric("time/elapsed_s", total, h.timestamp, h.step))
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
    """``launch``, returning (verl's exit code, the MLflow run id)."""
    from bench.tracking import RunLogger
    from reports.record import FAILURE

    config = make_verl_config(cfg, options)
    write_data(cfg, Path(config["data"]["train_files"]).parent)
    logger = RunLogger(cfg.tracking_uri, cfg.experiment)
    run_id = logger.start(run_name(cfg), *run_record(cfg))
    env_vars = config["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    env_vars.update({"MLFLOW_TRACKING_URI": logger.uri, "MLFLOW_RUN_ID": run_id})
    command = main_ppo_command(config, verl_python(options, python))
    env = {**os.environ, **env_vars}
    if os.environ.get("PYTHONPATH"):  # pobench's source tree first, then what the user had
        env["PYTHONPATH"] = os.pathsep.join([env_vars["PYTHONPATH"], os.environ["PYTHONPATH"]])
    from bench.train import _sigterm_as_interrupt, end_interrupted_run

    restore = _sigterm_as_interrupt()  # SIGTERM ends the run KILLED too (and verl with it), as a native one
    try:
        proc = subprocess.Popen(command, env=env)
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
    except BaseException as e:  # Ctrl-C / SIGTERM while verl runs, or the translation failed: not left RUNNING
        end_interrupted_run(logger, e)
        raise
    finally:
        restore()
    if rc:
        logger.set_tags({FAILURE: f"verl main_ppo exited with {rc}"})
    logger.end("FINISHED" if rc == 0 else "FAILED")
    return rc, run_id
