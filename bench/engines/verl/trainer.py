"""pobench's verl trainer (``trainer.v1.trainer_mode=pobench_sync``): verl's synchronous V1 trainer with pobench's
worker loss installed in the actor workers, the old-policy entropy kept and the reference entropy computed (part 1b
of the package docstring; verl's call path is in ``worker_loss.py``).

Three overrides of ``verl.trainer.ppo.v1.PPOTrainerSync``, each calling verl's own method or the same worker calls:

- ``_setup``: after verl built the workers (whose actor loss is ``ppo_loss``), ``actor_rollout_wg.set_loss_fn`` with
  ``pobench_worker_loss`` bound to the run's ActorConfig, in every actor worker, when the objective's plan is
  "worker-loss".
- ``_compute_old_log_prob``: verl's, which already computes the old policy's entropy (``calculate_entropy=True``) and
  stores it as field ``entropy``; copied to ``old_entropy`` (H_old), since the reference pass below overwrites it.
- ``_compute_ref_log_prob``: the reference forward with ``calculate_entropy=True`` (verl's asks for log-probs only);
  writes ``ref_log_prob`` as verl does and ``ref_entropy`` (H_ref), response positions, as the old pass does.

verl looks the trainer up by name in the process of its task runner (a Ray actor): this module registers it when
imported, and the generated config makes every process of the run import it (``$VERL_USE_EXTERNAL_MODULES``, read on
``import verl``). Needs verl's V1 trainer dependencies (TransferQueue: ``pip install verl[verl-core]``).
"""

from __future__ import annotations

import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.workers.utils.padding import response_from_nested

import bench.engines.verl  # noqa: F401  (registers the policy losses: the worker-loss names as stubs)
from bench.engines.verl.losses import PREFIX, TRAINER_MODE, _env_overrides, mapping
from bench.engines.verl.worker_loss import OLD_ENTROPY, REF_ENTROPY, REF_LOG_PROB, worker_loss_fn


def reference_fields(data: TensorDict) -> TensorDict:
    """The reference worker's output (nested ``log_probs`` / ``entropy`` over prompt + response, as verl's engine
    returns them) -> ``ref_log_prob`` and ``ref_entropy`` at response positions (nested, like ``old_log_probs``);
    ``entropy`` restored to H_old when ``old_entropy`` is given (verl's field, which the reference pass overwrote)."""
    mask = data["response_mask"]
    out = {REF_LOG_PROB: response_from_nested(data["log_probs"], mask),
           REF_ENTROPY: response_from_nested(data["entropy"], mask)}
    if OLD_ENTROPY in data.keys():
        out["entropy"] = data[OLD_ENTROPY]
    return TensorDict(out, batch_size=len(mask))


def uses_worker_loss(config) -> bool:
    """Whether the run's objective (``actor.policy_loss.loss_mode``) runs as pobench's worker loss."""
    loss_mode = str(config.actor_rollout_ref.actor.policy_loss.get("loss_mode", "vanilla"))
    if not loss_mode.startswith(PREFIX):
        return False
    name = loss_mode[len(PREFIX):]
    return mapping(name, _env_overrides().get(name)).mode == "worker-loss"


def _put(batch, fields: TensorDict):
    """Write ``fields`` of the batch's samples to TransferQueue; the batch's metadata, with every stored field."""
    meta = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
    meta.extra_info = dict(batch.extra_info or {})
    return meta


@register_trainer(TRAINER_MODE)
class PobenchTrainer(PPOTrainerSync):
    """verl's synchronous V1 trainer, with pobench's worker loss and the old / reference entropies in the batch."""

    def _setup(self):
        super()._setup()
        if uses_worker_loss(self.config):
            from verl.trainer.distillation import is_distillation_enabled
            from verl.utils.config import omega_conf_to_dataclass

            if is_distillation_enabled(self.config.get("distillation")):
                raise ValueError("pobench's worker loss replaces verl's actor loss: distillation is not supported")

            self.actor_rollout_wg.set_loss_fn(worker_loss_fn(omega_conf_to_dataclass(
                self.config.actor_rollout_ref.actor)))

    def _bypass(self) -> bool:
        corr = self.config.algorithm.get("rollout_correction", None)
        return bool(corr and corr.get("bypass_mode", False))

    def _compute_old_log_prob(self, batch, metrics):
        batch = super()._compute_old_log_prob(batch, metrics)
        if self._bypass():  # old log-probs are the sampler's: no old forward, no H_old (a loss needing it raises)
            return batch
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["entropy"])
        return _put(batch, TensorDict({OLD_ENTROPY: data["entropy"]}, batch_size=len(batch)))

    def _compute_ref_log_prob(self, batch, metrics):
        extra = {"calculate_entropy": True, "compute_loss": False,
                 "temperature": self.config.actor_rollout_ref.rollout.temperature}
        if self.ref_in_actor:  # LoRA: the reference is the actor without its adapter
            extra["no_lora_adapter"] = True
        batch.extra_info.update(extra)
        wg = self.actor_rollout_wg if self.ref_in_actor else self.ref_policy_wg
        output = wg.compute_log_prob(batch) if self.ref_in_actor else wg.compute_ref_log_prob(batch)
        if len(output) != len(batch):
            raise RuntimeError(f"reference forward returned {len(output)} samples for {len(batch)}")
        fields = ["log_probs", "entropy", "response_mask"] + ([] if self._bypass() else [OLD_ENTROPY])
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        return _put(batch, reference_fields(data))
