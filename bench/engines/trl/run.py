"""One TRL-engine training run (``train``, ``TRLEngine``); its command line is ``__main__.py``."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

from algorithms import get_objective
from bench.config import TrainConfig
from bench.data import TrainData, eval_problems
from bench.engines.base import CAPABILITIES, Hooks, TrainingDiverged, TrainResult
from bench.engines.trl.record import _callback_class, reward_function
from bench.engines.trl.support import check_supported, layout
from bench.engines.trl.trainer import _trainer_class
from bench.model import format_prompt, load_policy
from bench.rollout import stop_token_ids
from bench.runs.run import FINAL_TMP, Run
from reports import metric_keys as K
from reports.record import ENGINE, ENGINE_DISTRIBUTED, ENGINE_PROCESSES


def grpo_config(cfg: TrainConfig, run_dir: Path, world: int):
    from trl import GRPOConfig

    geo = layout(cfg, world)
    kw: dict[str, Any] = dict(
        output_dir=str(run_dir / "trl"), max_steps=cfg.steps * geo["updates_per_step"],
        learning_rate=cfg.lr, adam_beta1=cfg.adam_betas[0], adam_beta2=cfg.adam_betas[1],
        weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm, optim="adamw_torch",
        per_device_train_batch_size=geo["per_device"], gradient_accumulation_steps=geo["grad_accum"],
        steps_per_generation=geo["steps_per_generation"], num_generations=cfg.group_size,
        num_iterations=cfg.update_epochs, max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature,
        top_p=cfg.top_p, seed=cfg.seed, shuffle_dataset=False, logging_steps=geo["updates_per_step"],
        save_strategy="steps" if cfg.checkpoint_every else "no",
        save_steps=max(1, cfg.checkpoint_every) * geo["updates_per_step"], save_total_limit=None,  # (rotated by
        # pobench after its own checkpoint points at the new one: Run.save_state)
        save_only_model=False, use_cpu=cfg.device == "cpu", beta=0.0, loss_type="grpo",
        mask_truncated_completions=False, vllm_importance_sampling_correction=False,
        **({"gradient_checkpointing": True} if cfg.activation_checkpointing else {}), report_to="none",
        eval_strategy="no",
        remove_unused_columns=False, disable_dropout=True, bf16=False, fp16=False,  # autocast: engine_args
    )
    kw.update(cfg.engine_args)
    return GRPOConfig(**kw)


def export_model(trainer, tok, run: Run, main: bool) -> None:
    """``<run>/final``: written into a temporary folder and swapped in by the main process (Run.save_final),
    so it is complete or absent. Every process takes part in ``save_model`` (a sharded model is gathered for it);
    only the main one writes."""
    def write(folder: Path) -> None:
        trainer.save_model(str(folder))
        tok.save_pretrained(folder)

    if main:
        run.save_final(write)
    else:
        trainer.save_model(str(run.folder / FINAL_TMP))  # (writes nothing outside the main process)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def train(cfg: TrainConfig, hooks: Hooks | None = None) -> TrainResult:
    """Train ``cfg`` with TRL (``cfg.engine == "trl"``): the MLflow run is written by the main process only."""
    from datasets import Dataset  # (TRL's own dependency)

    hooks = hooks or Hooks()
    cfg.validate()
    check_supported(cfg)
    objective = get_objective(cfg.algo, **cfg.objective_overrides)
    run = Run.enter(cfg, objective)  # the run folder (claimed), seed and threads: bench/runs
    run_dir = run.folder
    resumed = run.load_state("trl")  # verified; an older one if need be; None: a new run
    args = grpo_config(cfg, run_dir, world_size())
    model, tok = load_policy(cfg.model, "cpu", cfg.dtype, cfg.revision)  # the Trainer places it
    need_ref = objective.needs_reference or cfg.track_ref_kl
    ref_model = copy.deepcopy(model) if need_ref else None
    data = TrainData(cfg.task, seed=cfg.seed, steps=cfg.steps, prompts_per_step=cfg.prompts_per_step,
                     data=cfg.data, difficulty=cfg.difficulty, skip_bad_rows=cfg.skip_bad_rows)
    eval_set = eval_problems(cfg.eval_task or cfg.task, limit=cfg.eval_problems, data=cfg.eval_data,
                             difficulty=cfg.difficulty, skip_bad_rows=cfg.skip_bad_rows)
    problems, rows = [], []
    for step in range(1, cfg.steps + 1):  # the native loop's prompts, in its order (TRL: shuffle_dataset=False)
        for p in data.batch(step, 0):
            rows.append({"prompt": format_prompt(tok, p.question, cfg.prompt_template),
                         "pobench_problem": len(problems)})
            problems.append(p)
    holder: dict[str, Any] = {}
    reward = reward_function(holder, objective, data.task, problems, cfg.max_new_tokens,
                             set(stop_token_ids(model, tok)))
    model.train()
    trainer = _trainer_class()(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                               processing_class=tok, objective=objective, pobench_cfg=cfg, ref_model=ref_model)
    holder["trainer"] = trainer
    main = trainer.accelerator.is_main_process
    logger = None
    if main:  # the same MLflow run when resuming, with the metrics its checkpoint had not yet written
        acc = trainer.accelerator
        logger = run.open(resume_state=resumed, tags={
            ENGINE: "trl", ENGINE_DISTRIBUTED: str(acc.distributed_type).split(".")[-1],
            ENGINE_PROCESSES: str(acc.num_processes)})
    # (on an error, metrics no checkpoint covers are not written: a resume trains those steps again)
    with run.recorded():  # (at once: no code between the open run and its guard)
        if resumed is not None:
            trainer.pobench_elapsed = resumed["elapsed"]
            trainer.pobench_cpu_s = resumed.get("cpu_s")  # (None in a checkpoint from before time/cpu_s)
        record = _callback_class()(cfg, logger, tok, eval_set, hooks, run=run,
                                   start_step=resumed["step"] if resumed is not None else 0)
        record.trainer = trainer
        trainer.add_callback(record)
        trainer.train(resume_from_checkpoint=resumed["trl_checkpoint"] if resumed is not None else None)
        loss_ok = all(math.isfinite(v) for h in trainer.state.log_history for k, v in h.items()
                      if k == K.LOSS and isinstance(v, float))
        if not loss_ok:
            raise TrainingDiverged(f"the loss became non-finite ({K.LOSS})")
        export_model(trainer, tok, run, main)  # complete (or absent: the run FAILED) ...
        if main:
            run.finish(record.stopped_early)  # ... before the run is FINISHED
    run_id = logger.run_id if logger is not None else ""
    return TrainResult(run_id, record.steps_done, run_dir, record.final_eval, record.stopped_early)


class TRLEngine:
    """TRL's ``GRPOTrainer`` with pobench's objective (package doc)."""

    name = "trl"
    capabilities = CAPABILITIES[name]

    def check(self, cfg: TrainConfig) -> None:
        check_supported(cfg)

    def train(self, cfg: TrainConfig, hooks: Hooks) -> TrainResult:
        return train(cfg, hooks)
