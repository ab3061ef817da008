"""pobench's replacement of verl's actor loss, for the objectives whose loss needs more than verl hands a policy loss
(``mapping(name).mode == "worker-loss"``: TEPO's entropy-masked KL, forking tokens, r·KL; part 1b of the package
docstring). ``trainer.py`` installs it in the actor workers and puts H_old and H_ref into the batch.

Where verl 0.9.1 computes the actor loss, and what this module replaces (V1 trainer, the default
``trainer.use_v1=true``; the legacy ``main_ppo_v0`` / ``RayPPOTrainer`` path is not hooked):

- ``verl/trainer/main_ppo.py: main -> run_ppo(config, TaskRunnerV1)``; ``TaskRunnerV1.run`` (a Ray actor) picks the
  trainer class by name, ``verl/trainer/ppo/v1/trainer_base.py: get_trainer_cls(config.trainer.v1.trainer_mode)``
  (registry filled by ``register_trainer``; ``sync`` is ``trainer_sync.py: PPOTrainerSync``).
- ``PPOTrainer._setup`` builds the worker groups and calls ``actor_rollout_wg.init_model()``:
  ``verl/workers/engine_workers.py: ActorRolloutRefWorker.init_model`` sets the actor's loss to
  ``partial(verl/workers/utils/losses.py: ppo_loss, config=ActorConfig)`` through ``TrainingWorker.set_loss_fn``.
  ``ActorRolloutRefWorker.set_loss_fn`` (Dispatch.ONE_TO_ALL) replaces it in every actor worker: the hook used here.
- Per step, ``PPOTrainer._step_once``: ``_compute_old_log_prob`` (actor forward with ``calculate_entropy=True``; writes
  ``old_log_probs`` and the old entropy as field ``entropy`` to TransferQueue), ``_compute_ref_log_prob`` only when
  ``need_reference_policy`` (``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``; ``calculate_entropy=False``:
  no H_ref; writes ``ref_log_prob``), ``_compute_advantage``, ``_update_actor`` (``calculate_entropy`` =
  ``actor.calculate_entropy or entropy_coeff != 0``).
- ``_update_actor`` -> ``ActorRolloutRefWorker.update_actor`` -> ``TrainingWorker.train_mini_batch`` (every field of
  the batch in TransferQueue, mini-batches) -> ``train_batch`` -> ``engine.train_batch`` ->
  ``verl/workers/engine/fsdp/transformer_impl.py: forward_backward_batch`` (sets ``batch_num_tokens`` / ``dp_size``,
  ``verl/workers/engine/utils.py: prepare_micro_batches``) -> ``forward_step`` -> ``loss_fn(model_output=...,
  data=micro_batch, dp_group=...)``: ``model_output["log_probs"]`` / ``["entropy"]`` are nested over prompt +
  response (with gradient), ``data`` the micro-batch TensorDict (nested per-response fields).

``pobench_worker_loss`` has that signature, ``(config, model_output, data, dp_group=None) -> (loss, metrics)`` like
``ppo_loss``. It builds a ``PolicyBatch`` (log-probs, H_θ, old log-probs, H_old, ref log-probs, H_ref, advantages,
mask) and returns the objective's whole loss, KL and entropy terms included (the plan sets verl's ``kl_loss_coef``
and ``entropy_coeff`` to 0), with the global-batch normalisation of the registered losses (``global_batch_info``).
verl is imported lazily: the package works without it.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import torch

from algorithms import batch_for, get_objective
from bench.engines.verl.losses import PREFIX, VerlMapping, _check_config, _env_overrides, _global_scale, mapping
from reports import metric_keys as K

#: fields pobench's trainer writes to the batch (TransferQueue), response positions only
OLD_ENTROPY = "old_entropy"
REF_ENTROPY = "ref_entropy"
#: verl's own fields the worker loss reads (besides response_mask, old_log_probs, advantages)
REF_LOG_PROB = "ref_log_prob"


@functools.cache
def _objective(loss_mode: str, overrides_json: str):
    if not loss_mode.startswith(PREFIX):
        raise ValueError(f"pobench's worker loss runs pobench objectives: actor.policy_loss.loss_mode={loss_mode!r} "
                         f"does not start with {PREFIX!r}")
    name = loss_mode[len(PREFIX):]
    overrides = json.loads(overrides_json)
    p = mapping(name, overrides)
    if p.mode != "worker-loss":
        raise ValueError(f"pobench objective {name!r} runs on verl as {p.mode!r}, not through the worker loss"
                         + (f": {p.reason}" if p.reason else " (keep verl's ppo_loss)"))
    return p, get_objective(name, **overrides)


def worker_objective(loss_mode: str) -> tuple[VerlMapping, Any]:
    """(plan, objective) that the worker loss runs for verl's ``actor.policy_loss.loss_mode`` (``pobench_<name>``),
    with the overrides from ``$POBENCH_VERL_OBJECTIVE_OVERRIDES`` as the registered losses read them."""
    name = loss_mode[len(PREFIX):] if loss_mode.startswith(PREFIX) else loss_mode
    return _objective(loss_mode, json.dumps(_env_overrides().get(name, {}), sort_keys=True))


def _to_width(t: torch.Tensor, width: int) -> torch.Tensor:
    """(B, T') -> (B, width): zero padding added or cut (past every response's end in both cases)."""
    if t.shape[1] >= width:
        return t[:, :width]
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))


def pobench_worker_loss(config, model_output: dict, data, dp_group=None) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's actor loss function (``TrainingWorker.loss_fn``), replaced: the pobench objective named by
    ``config.policy_loss.loss_mode`` on one micro-batch, scaled to its share of the global mini-batch loss.

    ``config``: verl's ActorConfig (bound by ``functools.partial`` as verl binds ``ppo_loss``); ``model_output``:
    nested ``log_probs`` (and ``entropy`` when ``calculate_entropy``) over prompt + response; ``data``: the micro-batch
    TensorDict with ``response_mask``, ``old_log_probs``, ``advantages`` and, as the objective needs them,
    ``ref_log_prob``, ``old_entropy``, ``ref_entropy``, plus verl's ``dp_size`` / ``batch_num_tokens`` /
    ``global_batch_size``."""
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.padding import no_padding_2_padding

    p, objective = worker_objective(config.policy_loss.get("loss_mode", "vanilla"))
    _check_config(p, config.loss_agg_mode, config)
    if "rollout_is_weights" in data.keys():
        raise ValueError(f"pobench objective {p.objective!r}: verl's rollout-correction weights are not applied by "
                         "pobench losses; turn algorithm.rollout_correction off")
    log_prob = no_padding_2_padding(model_output["log_probs"], data)  # (B, T), gradient
    entropy = model_output.get("entropy")
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)
    info = {"dp_size": data["dp_size"], "batch_num_tokens": data["batch_num_tokens"],
            "global_batch_size": data["global_batch_size"], "loss_scale_factor": config.loss_scale_factor}
    config.global_batch_info.update(info)

    optional = [k for k in (REF_LOG_PROB, OLD_ENTROPY, REF_ENTROPY) if k in data.keys()]
    td = data.select("response_mask", "old_log_probs", "advantages", *optional).to_padded_tensor()
    width = log_prob.shape[1]

    def field(key: str) -> torch.Tensor | None:
        return _to_width(td[key], width).to(log_prob.dtype) if key in td.keys() else None

    mask = field("response_mask")
    # outcome rewards: one advantage per completion, broadcast by verl over its tokens
    adv = (field("advantages") * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    max_length = int(config.loss_scale_factor) if config.loss_scale_factor else width
    try:
        batch = batch_for(objective, "verl worker loss", logprobs=log_prob, old_logprobs=field("old_log_probs"),
                          advantages=adv, mask=mask, max_length=max_length, entropy=entropy,
                          ref_logprobs=field(REF_LOG_PROB), old_entropy=field(OLD_ENTROPY),
                          ref_entropy=field(REF_ENTROPY))
        loss, metrics = objective.checked_loss(batch)
    except ValueError as e:  # a field the run did not compute (reference worker, entropies)
        raise ValueError(f"{e} (pobench's worker loss on verl: {OLD_ENTROPY} / {REF_ENTROPY} come from pobench's "
                         f"trainer, {REF_LOG_PROB} from verl's reference worker: make_verl_config sets both up)") from e
    scale = _global_scale(objective.config.aggregation, mask, config)
    loss = loss * scale
    # as verl's ppo_loss: actor/pg_loss is the policy term's share of the global mini-batch loss when the global batch
    # is known (summed over micro-batches; verl's actor/loss is the whole objective), the objective's own metrics
    # are micro-batch means
    scaled = info["dp_size"] > 1 or any(info[k] is not None for k in ("batch_num_tokens", "global_batch_size",
                                                                        "loss_scale_factor"))
    pg = metrics.get(K.POLICY_LOSS, loss.detach()) * scale
    out = Metric.from_dict({k: float(v) for k, v in metrics.items()}, aggregation=AggregationType.MEAN)
    out["actor/pg_loss"] = Metric(value=pg, aggregation=AggregationType.SUM if scaled else AggregationType.MEAN)
    return loss, out


def worker_loss_fn(actor_config):
    """The loss function to hand ``set_loss_fn``: ``pobench_worker_loss`` bound to verl's ActorConfig (pickled by
    reference: the workers import this module)."""
    return functools.partial(pobench_worker_loss, config=actor_config)
