"""`--engine trl`: train any registered pobench objective with a TRL ``GRPOTrainer`` subclass.

TRL generates (HF ``generate`` or vLLM, data-parallel under ``accelerate launch`` / ``torchrun``, DeepSpeed / FSDP);
pobench decides everything an objective owns:

- the loss: ``_compute_loss`` builds a ``PolicyBatch`` from TRL's per-token tensors (log-probs and entropies of the
  current policy from ``_get_per_token_logps_and_entropies``, π_old, π_ref, the sampler's log-probs) and returns the
  objective's ``loss``, weighted like the native loop's gradient accumulation (``Objective.loss_weight``) over the
  micro-batches of one optimizer step on every process;
- the rollout-side hooks: reward shaping (``shape_rewards``) in the reward function, advantages (``advantages``, with
  completion lengths when the estimator needs them) replacing TRL's in ``_generate_and_score_completions``, which also
  adds what TRL never computes: H_old (from the π_old scoring pass) and log π_ref / H_ref (pobench's own frozen copy of
  the initial policy, so TRL's ``beta`` stays 0);
- the record: one MLflow run per training run, written by the main process only, with the tags, params and metric
  names of every engine (bench/runs/lifecycle.py, bench/engines/step_stats.py: ``objective/*``, ``train/*``,
  ``rollout/*``, ``time/*``, ``eval/*`` at pobench steps:
  one step = one generation batch of ``prompts_per_step × group_size`` completions, ``minibatches × update_epochs``
  optimizer steps), so ``bench report`` reads it unchanged. The same metrics go through ``self._metrics`` to every
  ``report_to`` backend of TRL (``engine_args``).

Modules: ``support`` (what is honoured / refused, batch layout), ``trainer`` (the ``GRPOTrainer`` subclass),
``record`` (MLflow callback, reward function), ``run`` (``train``, ``TRLEngine``); ``__main__`` is its command line.

What it does not do is refused, naming the field: ``UNSUPPORTED`` (TrainConfig fields honoured only at their default),
``OBJECTIVE_UNSUPPORTED`` (objective fields), ``REFUSED_ENGINE_ARGS`` (GRPOConfig fields this module sets).

Several processes: ``torchrun --nproc_per_node N -m bench.engines.trl --config run.yaml`` (or ``accelerate launch``
with a DeepSpeed / FSDP config file); docs/SCALE.md "TRL engine".
"""

from __future__ import annotations

from bench.engines.trl.record import _callback_class, reward_function
from bench.engines.trl.run import TRLEngine, grpo_config, train, world_size
from bench.engines.trl.support import (
    ADVANTAGE_UNSUPPORTED,
    OBJECTIVE_UNSUPPORTED,
    PREFIXES,
    REFUSED_ENGINE_ARGS,
    UNSUPPORTED,
    check_supported,
    layout,
)
from bench.engines.trl.trainer import _trainer_class

__all__ = ["ADVANTAGE_UNSUPPORTED", "OBJECTIVE_UNSUPPORTED", "PREFIXES", "REFUSED_ENGINE_ARGS", "TRLEngine",
           "UNSUPPORTED", "_callback_class", "_trainer_class", "check_supported", "grpo_config", "layout",
           "reward_function", "train", "world_size"]
