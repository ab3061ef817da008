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
}
#: validation metrics: val-core/<data_source>/acc/mean@1 -> eval/accuracy (greedy when eval_temperature = 0)
VAL_PATTERN = re.compile(r"^val-core/(?P<source>[^/]+)/acc/mean@(?P<n>\d+)$")


def pobench_tags(cfg) -> dict[str, str]:
    """The tags bench/train.py gives a run, plus ``pobench.engine=verl``."""
    from bench.tracking import version_tags

    return {"pobench.kind": "train", "pobench.engine": "verl", "pobench.objective": cfg.algo,
            "pobench.seed": str(cfg.seed), "pobench.config_hash": cfg.comparison_hash(), **version_tags(),
            "pobench.model": cfg.model, "pobench.task": cfg.task, "pobench.control": cfg.control or "none",
            **({"pobench.comparison": cfg.comparison} if cfg.comparison else {}),
            **{k: str(v) for k, v in cfg.tags.items()}}


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
    for i in range(0, len(points), 1000):
        record.log_batch(client, run_id, metrics=points[i:i + 1000])
    return len(points)


# ------------------------------------------------------------------------------------------------ launch
def launch(cfg, options: VerlOptions | None = None, *, dry_run: bool = False, python: str = sys.executable) -> int:
    """Run one (objective, seed) of a comparison on verl (needs verl, GPUs, and a Ray cluster: ``RAY_ADDRESS`` or a
    local one). Writes the parquet data, creates the MLflow run with pobench's tags, runs ``verl.trainer.main_ppo``
    attached to it (``MLFLOW_RUN_ID``), then copies verl's metrics under pobench's names. Returns verl's exit code.
    ``dry_run``: print the command instead of running anything."""
    config = make_verl_config(cfg, options)
    command = main_ppo_command(config, python)
    if dry_run:
        print(shlex.join(command))
        return 0
    write_data(cfg, Path(config["data"]["train_files"]).parent)
    from bench.tracking import RunLogger, flatten

    logger = RunLogger(cfg.tracking_uri, cfg.experiment)
    run_id = logger.start(run_name(cfg), pobench_tags(cfg), flatten(cfg.to_dict()))
    env_vars = config["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    env_vars.update({"MLFLOW_TRACKING_URI": logger.uri, "MLFLOW_RUN_ID": run_id})
    command = main_ppo_command(config, python)
    env = {**os.environ, **env_vars}
    rc = subprocess.call(command, env=env)
    translate_metrics(logger.client, run_id, eval_source=cfg.eval_task or cfg.task)
    if rc:
        logger.set_tags({"pobench.failure": f"verl main_ppo exited with {rc}"})
    logger.end("FINISHED" if rc == 0 else "FAILED")
    return rc


