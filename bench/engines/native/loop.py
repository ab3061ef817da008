"""The native engine: pobench's own training loop, shared by every objective. It reads top to bottom:

    for each step:  sample prompts -> G completions each -> rewards (the task's verifier)
                    -> the objective's hooks: reward shaping, group filtering (DAPO refills), advantages
                    -> old / reference log-probs -> μ epochs x minibatches of gradient-accumulated updates
                       (after each, the objective's controller state advances: Objective.next_state)
                    -> metrics (wall-clock and CPU seconds, the machine's load), held-out evaluation, checkpoint
                       (then the metrics go to MLflow)

Objectives differ only in `algorithms/`: this file never branches on an objective's name. The run's folder, MLflow
record, checkpoints, interruption and end are the Run's (bench/runs/run.py), as for every engine.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from algorithms import get_objective
from bench.config import TrainConfig
from bench.data import TrainData, eval_problems
from bench.engines.base import CAPABILITIES, Hooks, StopTraining, TrainResult
from bench.engines.native.critic import Critic
from bench.engines.native.scale import Reference, is_peft, merged_for_export, prepare_policy, trainable_parameters
from bench.engines.native.step import collect_rollouts, roll_samples, step_tokens, update
from bench.engines.step_stats import machine_load, throughput
from bench.evaluate import eval_metrics, held_out_result
from bench.model import load_policy, warn_unknown_characters
from bench.rollout import make_sampler
from bench.runs import stop
from bench.runs.run import CheckpointError, DiskFull, Run
from bench.runs.tracking import StoreUnreachable
from reports import metric_keys as K


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    def f(i: int) -> float:
        if i < cfg.warmup_steps:
            return (i + 1) / (cfg.warmup_steps + 1)
        frac = (i - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        if cfg.lr_schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
        if cfg.lr_schedule == "linear":
            return max(0.0, 1 - frac)
        return 1.0
    return f


def advance_lr(scheduler) -> None:
    """One scheduler step. A step without update (no informative group) still advances the LR; torch then warns
    that the scheduler stepped before the optimizer, which is intended here (the message is matched literally)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"))
        scheduler.step()


def train(cfg: TrainConfig, hooks: Hooks | None = None) -> TrainResult:
    """Train `cfg.algo` as configured; log to MLflow; checkpoint; resume with ``cfg.resume`` (``Hooks``: what the
    caller is told during training)."""
    hooks = hooks or Hooks()
    cfg.validate()  # out-of-range config: error before any work starts
    objective = get_objective(cfg.algo, **cfg.objective_overrides)
    run = Run.enter(cfg, objective)  # the run folder (claimed), seed and threads: bench/runs
    run_dir = run.folder

    # --- policy, reference, rollout sampler, optimizer
    model, tok = load_policy(cfg.model, cfg.device, cfg.dtype, cfg.revision)
    model = prepare_policy(model, cfg)  # LoRA adapter, activation checkpointing (scale.py)
    need_ref = objective.needs_reference or cfg.track_ref_kl
    ref_model = Reference(model) if need_ref else None  # LoRA: the base model with the adapter disabled
    sampler = make_sampler(cfg.backend, model, tok)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=cfg.lr, betas=tuple(cfg.adam_betas),
                                  weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    # the critic the objective declares (PPO's value function), from the policy's initial weights; None: no critic
    critic = Critic(model, objective.critic) if objective.critic is not None else None

    # --- data: same prompts at the same step for every objective and seed-matched run
    data = TrainData(cfg.task, seed=cfg.seed, steps=cfg.steps, prompts_per_step=cfg.prompts_per_step,
                     data=cfg.data, difficulty=cfg.difficulty, skip_bad_rows=cfg.skip_bad_rows)
    eval_task, eval_set = eval_problems(cfg.eval_task or cfg.task, limit=cfg.eval_problems, data=cfg.eval_data,
                                        difficulty=cfg.difficulty, skip_bad_rows=cfg.skip_bad_rows)
    warn_unknown_characters(tok, [p.question for p in data.pool], "training prompts")
    warn_unknown_characters(tok, [p.question for p in eval_set], "held-out prompts")

    # --- MLflow run (new, or the same one when resuming from the newest checkpoint)
    state = run.load(model=model, optimizer=optimizer, scheduler=scheduler, critic=critic)  # None: a new run
    if state is not None:
        sampler.update_weights(model)
        try:  # the objective's controller where the checkpoint left it (nothing for a stateless objective)
            objective.restore_state(state.get("objective_state"))
        except ValueError as e:
            raise CheckpointError(f"{run_dir}, checkpoint of step {state['step']}: {e}") from None
    start_step, elapsed = (state["step"], state["elapsed"]) if state is not None else (0, 0.0)
    # CPU seconds of the training steps, continued like elapsed (None: a checkpoint written before time/cpu_s existed
    # holds none, so the resumed run logs none rather than a count restarted from 0)
    cpu_s = state.get("cpu_s") if state is not None else 0.0

    def evaluate_now(step: int, given: dict[str, float] | None = None) -> dict[str, float]:
        m = dict(given) if given is not None else eval_metrics(held_out_result(cfg, sampler, tok, eval_task,
                                                                               eval_set))
        logger.log(m, step)
        return m

    def save_checkpoint(step: int) -> None:
        """Checkpoint ``step`` with the metrics not yet in MLflow, then send them: the checkpoint never depends on
        the store (when it cannot take them, they stay in the checkpoint and a resume logs them)."""
        nonlocal saved, full
        try:
            run.save(step, model=model, optimizer=optimizer, scheduler=scheduler,
                     state={"run_id": logger.run_id, "elapsed": elapsed, "cpu_s": cpu_s,
                            "pending": logger.pending, "objective_state": objective.state},
                     keep=cfg.keep_checkpoints, critic=critic)
        except DiskFull:
            full = True  # (no second try on the way out)
            raise
        saved = step
        if logger.unreachable is None:
            logger.flush()

    def write_final(folder: Path) -> None:
        if is_peft(model):
            model.save_pretrained(folder / "adapter")
        merged_for_export(model).save_pretrained(folder)
        tok.save_pretrained(folder)

    final_eval: dict[str, float] = {}
    stopped_early = False
    step = completed = saved = start_step
    changed = False  # True once an optimizer step of an unfinished step has changed the model
    full = False  # True once a checkpoint found the disk full

    def model_changed(*_) -> None:
        nonlocal changed
        changed = True

    def keep_last_step() -> None:
        """On an interrupt or error: checkpoint the last finished step when the model is still exactly that step's
        (its metrics are sent when the store answers; else the checkpoint keeps them)."""
        if not changed and completed > saved and not full:
            try:
                save_checkpoint(completed)
            except StoreUnreachable:
                pass

    signals = stop.count()  # a stop signal after this one whose interrupt was swallowed stops at a step's end
    step_hook = optimizer.register_step_pre_hook(model_changed)  # (before: an interrupt inside step() counts)
    logger = run.open(resume_state=state)  # (ends its run itself if interrupted inside)
    try:
        with run.recorded(on_error=keep_last_step):  # (at once: no code between the open run and its guard)
            if start_step == 0 and cfg.eval_every > 0:
                final_eval = evaluate_now(0, hooks.step0_eval)
                try:
                    hooks.eval(0, {**final_eval, K.ELAPSED_S: 0.0})
                except StopTraining:
                    stopped_early = True
            for step in range(start_step + 1, cfg.steps + 1 if not stopped_early else start_step + 1):
                t_step, c_step = time.perf_counter(), time.process_time()
                groups, roll = collect_rollouts(cfg, objective, sampler, tok, data, step)
                t_rollout = time.perf_counter() - t_step
                upd = update(cfg, objective, model, ref_model, optimizer, sampler, groups, step, critic=critic)
                advance_lr(scheduler)
                step_s, step_cpu = time.perf_counter() - t_step, time.process_time() - c_step
                elapsed += step_s
                metrics = {**roll, **upd, **objective.state_metrics(), K.LR: scheduler.get_last_lr()[0],
                           K.ROLLOUT_S: t_rollout,
                           K.STEP_S: step_s, K.ELAPSED_S: elapsed, **machine_load()}
                if cpu_s is not None:  # this process's CPU time (all its threads) in the step: not the machine's load
                    cpu_s += step_cpu
                    metrics[K.CPU_S] = cpu_s
                metrics[K.UPDATE_S] = step_s - t_rollout - metrics.get(K.SCORING_S, 0.0)
                metrics.update(throughput(step_tokens(groups), step_s, devices=1))  # (one process, one device)
                logger.log(metrics, step)
                hooks.step(step, metrics)
                if cfg.samples_every and (step % cfg.samples_every == 0 or step == 1):
                    logger.log_samples(step, roll_samples(groups, tok))
                is_last = step == cfg.steps
                if cfg.eval_every > 0 and (step % cfg.eval_every == 0 or is_last):
                    final_eval = evaluate_now(step)
                    try:
                        hooks.eval(step, {**final_eval, K.ELAPSED_S: elapsed})
                    except StopTraining:
                        stopped_early = True
                completed, changed = step, False
                stop.swallowed(signals, f"the end of step {step}")  # (a stop a plugin caught: it stops here)
                if stopped_early or is_last or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                    save_checkpoint(step)
                if stopped_early:
                    break
            run.save_final(write_final)  # <run>/final complete (or absent: the run FAILED) ...
            run.finish(stopped_early)  # ... before the run is FINISHED
    finally:
        step_hook.remove()
    return TrainResult(logger.run_id, step, run_dir, final_eval, stopped_early)


class NativeEngine:
    """pobench's own loop (``train`` above)."""

    name = "native"
    capabilities = CAPABILITIES[name]

    def check(self, cfg: TrainConfig) -> None:
        """Nothing beyond ``TrainConfig.validate``: the native loop trains every valid config."""

    def train(self, cfg: TrainConfig, hooks: Hooks) -> TrainResult:
        return train(cfg, hooks)
