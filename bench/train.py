"""The ONE training loop shared by every objective. It reads top to bottom:

    for each step:  sample prompts -> G completions each -> rewards (the task's verifier)
                    -> the objective's hooks: reward shaping, group filtering (DAPO refills), advantages
                    -> old / reference log-probs -> μ epochs x minibatches of gradient-accumulated updates
                    -> metrics, held-out evaluation, checkpoint (then the metrics go to MLflow)

Objectives differ only in `algorithms/`: this file never branches on an objective's name.
"""

from __future__ import annotations

import json
import math
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from algorithms import get_objective
from bench import checkpoint
from bench.config import BUILTIN_MODEL, TrainConfig
from bench.data import TrainData, eval_problems
from bench.model import load_policy, warn_unknown_characters
from bench.rollout import make_engine
from bench.scale import Reference, is_peft, merged_for_export, prepare_policy, trainable_parameters
from bench.step import (
    TrainingDiverged,
    collect_rollouts,
    derive_seed,
    roll_samples,
    step_tokens,
    throughput,
    update,
)
from bench.tracking import RunLogger, flatten, version_tags
from reports.record import (
    COMPARISON,
    CONFIG_HASH,
    CONTROL,
    ENGINE,
    FAILURE,
    KIND,
    MODEL,
    OBJECTIVE,
    SEED,
    STOPPED,
    TASK,
)


class StopTraining(Exception):
    """Raised by an ``on_eval`` callback to end a run early (e.g. an Optuna pruner)."""


@dataclass
class TrainResult:
    run_id: str
    steps_done: int
    output_dir: Path
    final_eval: dict[str, float] = field(default_factory=dict)
    stopped_early: bool = False


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


def held_out_result(cfg: TrainConfig, engine, tok, eval_bench, eval_set):
    """One held-out evaluation of the engine's current policy -> ``bench.evaluate.EvalResult``."""
    from bench.evaluate import evaluate

    return evaluate(engine, tok, eval_bench, eval_set, k=1 if cfg.eval_temperature > 0 else 0,
                    temperature=cfg.eval_temperature or 1.0, seed=derive_seed(cfg.seed, "eval"),
                    n_samples=cfg.eval_samples if cfg.eval_temperature > 0 else 0,
                    max_new_tokens=cfg.max_new_tokens, prompt_template=cfg.prompt_template)


def eval_metrics(res) -> dict[str, float]:
    """The ``eval/*`` metrics logged for one held-out evaluation (and ``time/eval_s``)."""
    m = res.flat_metrics()
    m["eval/accuracy"] = res.metrics["greedy_acc"].value
    if "pass@1" in res.metrics:
        m["eval/accuracy_sampled"] = res.metrics["pass@1"].value
    m["time/eval_s"] = res.seconds
    return m


def train(cfg: TrainConfig, *, on_eval: Callable[[int, dict[str, float]], None] | None = None,
          on_step: Callable[[int, dict[str, float]], None] | None = None,
          step0_eval: dict[str, float] | None = None) -> TrainResult:
    """Train `cfg.algo` as configured; log to MLflow; checkpoint; resume with ``cfg.resume``.

    ``on_eval(step, eval_metrics)`` after each held-out evaluation (may raise StopTraining); ``on_step(step,
    metrics)`` after each training step (progress displays). ``step0_eval``: the step-0 (before training) held-out
    metrics already computed for this exact policy and evaluation (`bench run` evaluates the shared starting policy
    once per comparison): logged at step 0 instead of evaluating again."""
    cfg.validate()  # out-of-range config: error before any work starts
    if cfg.engine != "native":  # the ONE place an engine other than this loop is chosen (bench/engines/)
        if cfg.engine == "verl":
            from bench.engines.verl.run import train as verl_train

            return verl_train(cfg, on_eval=on_eval, on_step=on_step, step0_eval=step0_eval)
        from bench.engines import trl

        return trl.train(cfg, on_eval=on_eval, on_step=on_step, step0_eval=step0_eval)
    objective = get_objective(cfg.algo, **cfg.objective_overrides)
    run_name, run_dir, last = run_folder(cfg)
    seed_and_threads(cfg)

    # --- policy, reference, rollout engine, optimizer
    model, tok = load_policy(cfg.model, cfg.device, cfg.dtype)
    model = prepare_policy(model, cfg)  # LoRA adapter, activation checkpointing (bench/scale.py)
    need_ref = objective.needs_reference or cfg.track_ref_kl
    ref_model = Reference(model) if need_ref else None  # LoRA: the base model with the adapter disabled
    engine = make_engine(cfg.backend, model, tok)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=cfg.lr, betas=tuple(cfg.adam_betas),
                                  weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))

    # --- data: same prompts at the same step for every objective and seed-matched run
    data = TrainData(cfg.task, seed=cfg.seed, steps=cfg.steps, prompts_per_step=cfg.prompts_per_step,
                     data=cfg.data, difficulty=cfg.difficulty, skip_bad_rows=cfg.skip_bad_rows)
    eval_bench, eval_set = eval_problems(cfg.eval_task or cfg.task, limit=cfg.eval_problems, data=cfg.eval_data,
                                         difficulty=cfg.difficulty, skip_bad_rows=cfg.skip_bad_rows)
    warn_unknown_characters(tok, [p.question for p in data.pool], "training prompts")
    warn_unknown_characters(tok, [p.question for p in eval_set], "held-out prompts")

    # --- MLflow run (new, or the same one when resuming)
    logger = RunLogger(cfg.tracking_uri, cfg.experiment)
    start_step, elapsed = 0, 0.0
    if last is not None:
        state = checkpoint.load(last, model=model, optimizer=optimizer, scheduler=scheduler)
        engine.update_weights(model)
        logger.reopen(state["run_id"], [tuple(p) for p in state["pending"]])
        start_step, elapsed = state["step"], state["elapsed"]
    else:
        logger.start(run_name, *run_tags_and_params(cfg, objective))
        cfg.save(run_dir / "config.yaml")
        logger.log_artifact(run_dir / "config.yaml")

    def evaluate_now(step: int, given: dict[str, float] | None = None) -> dict[str, float]:
        m = dict(given) if given is not None else eval_metrics(held_out_result(cfg, engine, tok, eval_bench, eval_set))
        logger.log(m, step)
        return m

    def save_checkpoint(step: int) -> None:
        checkpoint.save(run_dir, step, model=model, optimizer=optimizer, scheduler=scheduler,
                        state={"run_id": logger.run_id, "elapsed": elapsed, "pending": logger.pending},
                        keep=cfg.keep_checkpoints)
        logger.flush()

    final_eval: dict[str, float] = {}
    stopped_early = False
    step = completed = saved = start_step
    changed = False  # True once an optimizer step of an unfinished step has changed the model

    def model_changed(*_) -> None:
        nonlocal changed
        changed = True

    step_hook = optimizer.register_step_pre_hook(model_changed)  # (before: an interrupt inside step() counts)
    restore_sigterm = _sigterm_as_interrupt()
    try:
        if start_step == 0 and cfg.eval_every > 0:
            final_eval = evaluate_now(0, step0_eval)
            try:
                _call(on_eval, 0, {**final_eval, "time/elapsed_s": 0.0})
            except StopTraining:
                stopped_early = True
        for step in range(start_step + 1, cfg.steps + 1 if not stopped_early else start_step + 1):
            t_step = time.perf_counter()
            groups, roll = collect_rollouts(cfg, objective, engine, tok, data, step)
            t_rollout = time.perf_counter() - t_step
            upd = update(cfg, objective, model, ref_model, optimizer, engine, groups, step)
            with warnings.catch_warnings():  # a step without update (no informative group) still advances the LR
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()`")
                scheduler.step()
            step_s = time.perf_counter() - t_step
            elapsed += step_s
            metrics = {**roll, **upd, "train/lr": scheduler.get_last_lr()[0], "time/rollout_s": t_rollout,
                       "time/step_s": step_s, "time/elapsed_s": elapsed}
            metrics["time/update_s"] = step_s - t_rollout - metrics.get("time/scoring_s", 0.0)
            metrics.update(throughput(step_tokens(groups), step_s, devices=1))  # (one process, one device)
            logger.log(metrics, step)
            _call(on_step, step, metrics)
            if cfg.samples_every and (step % cfg.samples_every == 0 or step == 1):
                logger.log_text(json.dumps(roll_samples(groups, tok), indent=1), f"samples/step_{step:06d}.json")
            is_last = step == cfg.steps
            if cfg.eval_every > 0 and (step % cfg.eval_every == 0 or is_last):
                final_eval = evaluate_now(step)
                try:
                    _call(on_eval, step, {**final_eval, "time/elapsed_s": elapsed})
                except StopTraining:
                    stopped_early = True
            completed, changed = step, False
            if stopped_early or is_last or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                save_checkpoint(step)
                saved = step
            if stopped_early:
                logger.set_tags({STOPPED: "early"})
                break
    except BaseException as e:
        # keep what is computed: checkpoint the last finished step when the model is still exactly that step's
        if not changed and completed > saved:
            save_checkpoint(completed)
        end_interrupted_run(logger, e)
        raise
    finally:
        restore_sigterm()
        step_hook.remove()
    logger.end("FINISHED")
    if is_peft(model):
        model.save_pretrained(run_dir / "final" / "adapter")
    merged_for_export(model).save_pretrained(run_dir / "final")
    tok.save_pretrained(run_dir / "final")
    return TrainResult(logger.run_id, step, run_dir, final_eval, stopped_early)


def run_folder(cfg: TrainConfig) -> tuple[str, Path, Path | None]:
    """The run's name, its folder and newest checkpoint (every engine): a checkpoint there without ``cfg.resume`` is
    refused, so a run is never overwritten."""
    run_dir = Path(cfg.output_dir) / cfg.run_label()
    last = checkpoint.latest(run_dir)
    if last is not None and not cfg.resume:
        raise ValueError(f"{run_dir} already holds checkpoints of a run; pass --resume to continue it, or choose "
                         "another --output-dir / --run-name")
    return cfg.run_label(), run_dir, last


def seed_and_threads(cfg: TrainConfig) -> None:
    """torch's seed and intra-op threads for ``cfg`` (1 for a built-in model: its matrices are too small to gain)."""
    torch.manual_seed(cfg.seed)
    threads = cfg.threads or (1 if cfg.model.startswith("builtin:") else 0)
    if threads:
        torch.set_num_threads(threads)


def check_engine(cfg: TrainConfig) -> None:
    """Refuse, before any work starts, a config its engine cannot train: ValueError naming the cause (the TRL engine's
    unsupported fields, a verl run without verl or with what verl cannot run). Nothing for the native loop."""
    if cfg.engine == "trl":
        from bench.engines.trl.support import check_supported

        check_supported(cfg)
    elif cfg.engine == "verl":
        from bench.engines.verl.run import preflight

        preflight(cfg)


def end_interrupted_run(logger, e: BaseException) -> None:
    """End the MLflow run of a training that stopped with ``e`` (every engine records it the same way): KILLED for
    Ctrl-C / SIGTERM, else FAILED with the cause in ``pobench.failure``."""
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        logger.end("KILLED")
        return
    cause = str(e) if isinstance(e, TrainingDiverged) else f"{type(e).__name__}: {e}"
    logger.set_tags({FAILURE: cause[:5000]})
    logger.end("FAILED")


def run_tags_and_params(cfg: TrainConfig, objective) -> tuple[dict[str, str], dict[str, str]]:
    """The tags and params of a new training run's MLflow record (every engine writes the same ones)."""
    written_by = version_tags()  # pobench.version, pobench.git_commit
    tags = {KIND: "train", OBJECTIVE: cfg.algo, SEED: str(cfg.seed),
            CONFIG_HASH: cfg.comparison_hash(), **written_by,
            MODEL: cfg.model, TASK: cfg.task,
            CONTROL: cfg.control or "none", **({COMPARISON: cfg.comparison}
                                                        if cfg.comparison else {}),
            **({ENGINE: cfg.engine} if cfg.engine != "native" else {}),
            **{k: str(v) for k, v in cfg.tags.items()}}
    params = {**flatten(cfg.to_dict()), **flatten({"objective": vars_of(objective.config)}), **written_by}
    return tags, params


def _call(cb, step, metrics) -> None:
    if cb is not None:
        cb(step, metrics)


def _sigterm_as_interrupt() -> Callable[[], None]:
    """Turn SIGTERM into KeyboardInterrupt so a terminated run checkpoints what it has (main thread only)."""
    try:
        previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    except ValueError:  # not the main thread
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)


def vars_of(cfg) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(cfg)


__all__ = ["BUILTIN_MODEL", "StopTraining", "TrainResult", "TrainingDiverged", "train"]
