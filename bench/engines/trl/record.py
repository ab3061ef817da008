"""The record of a TRL-engine run: pobench's MLflow run and held-out evaluations at pobench steps (a
``TrainerCallback``), and the reward function that records what advantages and metrics need."""

from __future__ import annotations

from pathlib import Path

import torch

from bench.config import TrainConfig
from bench.engines.base import Hooks, StopTraining
from bench.engines.trl.support import PREFIXES
from bench.evaluate import eval_metrics, held_out_result
from bench.rollout import make_sampler
from evaluators.tasks import checked_reward
from reports import metric_keys as K


# ----------------------------------------------------------------------------------------------- the record
def _callback_class():
    from transformers import TrainerCallback

    class PobenchRecord(TrainerCallback):
        """pobench's MLflow run (main process only) and held-out evaluations at pobench steps."""

        def __init__(self, cfg: TrainConfig, logger, tok, eval_set, hooks: Hooks, run=None, start_step: int = 0):
            self.cfg, self.logger, self.tok, self.eval_set, self.hooks = cfg, logger, tok, eval_set, hooks
            self.k = cfg.minibatches * cfg.update_epochs
            self.trainer = None
            self.final_eval: dict[str, float] = {}
            self.stopped_early = False
            self.steps_done = start_step  # > 0: resumed from the checkpoint of that step
            self.run = run  # (bench.runs.run.Run: its checkpoints)

        def _evaluate(self, step: int, given: dict[str, float] | None = None) -> None:
            from trl.models import unwrap_model_for_generation

            tr = self.trainer
            metrics = dict(given) if given is not None else None
            with unwrap_model_for_generation(tr.model_wrapped, tr.accelerator) as model:
                if metrics is None and tr.accelerator.is_main_process:
                    was = model.training
                    try:
                        sampler = make_sampler("hf", model, self.tok)
                        metrics = eval_metrics(held_out_result(self.cfg, sampler, self.tok, *self.eval_set))
                    finally:
                        model.train(was)
            tr.accelerator.wait_for_everyone()
            if self.logger is None or metrics is None:
                return
            self.logger.log(metrics, step)
            self.final_eval = metrics
            try:
                self.hooks.eval(step, {**metrics, K.ELAPSED_S: tr.pobench_elapsed})
            except StopTraining:
                self.stopped_early = True
                tr.control.should_training_stop = True

        def on_train_begin(self, args, state, control, **kwargs):
            if self.cfg.eval_every > 0 and self.steps_done == 0:  # (a resumed run has its step-0 evaluation)
                self._evaluate(0, self.hooks.step0_eval)

        def on_save(self, args, state, control, **kwargs):
            """After TRL wrote checkpoint-<global step>: pobench's checkpoint of this step (run id, the metrics not
            yet in MLflow, elapsed time and CPU seconds, TRL's folder), then the metrics go to MLflow, as the native
            loop does."""
            if self.logger is None or state.global_step % self.k:
                return
            trl_dir = Path(args.output_dir).resolve() / f"checkpoint-{state.global_step}"
            self.run.save_state(state.global_step // self.k, {
                "run_id": self.logger.run_id, "pending": self.logger.pending, "elapsed": self.trainer.pobench_elapsed,
                "cpu_s": self.trainer.pobench_cpu_s, "trl_checkpoint": str(trl_dir), "engine": "trl"},
                keep=self.cfg.keep_checkpoints)
            self.logger.flush()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs or state.global_step % self.k:
                return
            step = state.global_step // self.k
            self.steps_done = step
            metrics = {k: v for k, v in logs.items() if k.startswith(PREFIXES) and v is not None}
            if self.logger is not None:
                self.logger.log(metrics, step)
                self.hooks.step(step, metrics)
                if self.cfg.samples_every and (step % self.cfg.samples_every == 0 or step == 1):
                    self.logger.log_samples(step, self.trainer.pobench_samples)
            if self.cfg.eval_every > 0 and (step % self.cfg.eval_every == 0 or step == self.cfg.steps):
                self._evaluate(step)
            # (the metrics stay buffered until a checkpoint covers them, on_save: a resumed run logs no step twice)

    return PobenchRecord


def reward_function(trainer_ref: dict, objective, task, problems: list, max_new_tokens: int, eos: set[int]):
    """TRL reward function: the verifier's outcome, shaped by the objective; records what advantages / metrics need."""
    def pobench_reward(prompts, completions, completion_ids, pobench_problem, **_):
        rec = trainer_ref["trainer"]._pb_reward
        out = []
        for text, ids, idx in zip(completions, completion_ids, pobench_problem):
            correct = checked_reward(task, text, problems[idx])
            length = len(ids)
            shaped = float(objective.shape_rewards(torch.tensor([correct]), torch.tensor([length]),
                                                   max_new_tokens)[0])
            rec["correct"].append(correct)
            rec["shaped"].append(shaped)
            rec["length"].append(length)
            rec["truncated"].append(float(length >= max_new_tokens and (not ids or ids[-1] not in eos)))
            rec["texts"].append(text)
            rec["questions"].append(problems[idx].question)
            out.append(shaped)
        return out
    return pobench_reward
