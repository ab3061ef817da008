"""``PobenchGRPOTrainer``: TRL's ``GRPOTrainer`` with the objective's loss, advantages and reference (package doc)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

from algorithms import PolicyBatch, batch_for
from bench.config import TrainConfig
from bench.data import derive_seed
from bench.engines.native.loop import lr_lambda
from bench.engines.step_stats import UpdateStats, entropy_summary, machine_load, rollout_summary, throughput
from reports import metric_keys as K


# ----------------------------------------------------------------------------------------------- the trainer
def _trainer_class():
    from trl import GRPOTrainer
    from trl.models import prepare_deepspeed, prepare_fsdp
    from trl.trainer.utils import add_fused_lm_head

    class PobenchGRPOTrainer(GRPOTrainer):
        """A ``GRPOTrainer`` whose loss, advantages and reference are pobench's objective's (module doc)."""

        def __init__(self, *args, objective, pobench_cfg: TrainConfig, ref_model=None, **kwargs):
            if kwargs["args"].use_liger_kernel:
                raise ValueError("--engine trl: use_liger_kernel is refused: Liger's GRPO loss path computes its own "
                                 "loss instead of _compute_loss (and TRL 1.16 deprecates the option)")
            if kwargs["args"].beta != 0.0:
                raise ValueError("--engine trl: GRPOConfig.beta must be 0: the objective owns its KL term")
            super().__init__(*args, **kwargs)
            self.objective = objective
            self.pobench_cfg = pobench_cfg
            self.max_length = pobench_cfg.max_new_tokens
            self.ref_model = None
            if ref_model is not None:  # log π_ref and H_ref: one frozen copy of the initial policy
                ref_model.eval().requires_grad_(False)
                add_fused_lm_head(ref_model, temperature=self.temperature, outputs=("log_probs", "entropy"))
                if self.is_deepspeed_enabled:
                    ref_model = prepare_deepspeed(ref_model, self.accelerator)
                elif self.is_fsdp_enabled:
                    ref_model = prepare_fsdp(ref_model, self.accelerator)
                else:
                    ref_model = self.accelerator.prepare_model(ref_model, evaluation_mode=True)
                self.ref_model = ref_model
            self._pb_capture: list | None = None   # H_old captured from TRL's π_old scoring pass
            self._pb_reward: dict[str, list] = defaultdict(list)  # local outcomes / lengths of the reward call
            self._pb_step_metrics: dict[str, float] = {}   # rollout/* and time/* of the current step
            self._pb_stats = UpdateStats()  # this process's micro-batches of the current step
            self._pb_entropies: list[torch.Tensor] = []  # rollout entropies (on-policy: the first update's)
            self._pb_entropy_pending = False
            self._pb_step_start = time.perf_counter()
            self._pb_step_cpu = time.process_time()
            self.pobench_elapsed = 0.0
            self.pobench_cpu_s: float | None = 0.0  # None: resumed from a checkpoint without it (not logged)
            self.pobench_samples: list[dict[str, Any]] = []

        # --- learning-rate schedule: the native loop's, per pobench step (M·μ optimizer steps)
        def create_scheduler(self, num_training_steps: int, optimizer=None):
            if self.lr_scheduler is None:
                f, k = lr_lambda(self.pobench_cfg), self.pobench_cfg.minibatches * self.pobench_cfg.update_epochs
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer,
                                                                      lambda i: f(i // k))
            return self.lr_scheduler

        # --- scoring: capture H_old from the π_old pass TRL runs for off-policy updates
        def _get_per_token_logps_and_entropies(self, model, *args, compute_entropy=False, **kwargs):
            if self._pb_capture is not None and model is self.model and not torch.is_grad_enabled():
                logps, ent, aux = super()._get_per_token_logps_and_entropies(model, *args, compute_entropy=True,
                                                                            **kwargs)
                self._pb_capture.append(ent)
                return logps, (ent if compute_entropy else None), aux
            return super()._get_per_token_logps_and_entropies(model, *args, compute_entropy=compute_entropy,
                                                              **kwargs)

        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            self._pb_step_metrics[K.ROLLOUT_S] = time.perf_counter() - t0
            return out

        # --- rollouts: the objective's advantages; H_old, π_ref, H_ref added; rollout/* metrics
        def _generate_and_score_completions(self, inputs):
            if not self.model.training:
                return super()._generate_and_score_completions(inputs)
            self._pb_step_start, self._pb_step_cpu = time.perf_counter(), time.process_time()
            self._pb_reward.clear()
            self._pb_capture = []
            try:
                out = super()._generate_and_score_completions(inputs)
            finally:
                captured, self._pb_capture = self._pb_capture, None
            acc = self.accelerator
            G = self.num_generations
            mask = out["completion_mask"]
            local_n = mask.shape[0]
            rew = self._pb_reward
            shaped = acc.gather(torch.tensor(rew["shaped"], dtype=torch.float32, device=mask.device))
            correct = acc.gather(torch.tensor(rew["correct"], dtype=torch.float32, device=mask.device))
            lengths = acc.gather(torch.tensor(rew["length"], dtype=torch.float32, device=mask.device))
            trunc = acc.gather(torch.tensor(rew["truncated"], dtype=torch.float32, device=mask.device))
            extra = {"lengths": lengths.view(-1, G)} if "lengths" in self.objective.advantage_needs else {}
            adv = self.objective.advantages(shaped.view(-1, G).cpu(), **{k: v.cpu() for k, v in extra.items()})
            adv = adv.flatten().to(mask.device)
            rank = acc.process_index
            out["advantages"] = adv[rank * local_n:(rank + 1) * local_n].float()
            out["pobench_truncated"] = torch.tensor(rew["truncated"], dtype=torch.bool, device=mask.device)
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            attn = torch.cat([out["prompt_mask"], mask], dim=1)
            self._pb_step_metrics[K.TOTAL_NUM_TOKENS] = float(acc.gather(attn.sum().reshape(1)).sum())
            T = out["completion_ids"].shape[1]
            if captured:
                out["pobench_old_entropy"] = torch.cat(captured, dim=0)
            if self.ref_model is not None:
                with torch.no_grad():
                    ref_lp, ref_ent, _ = super()._get_per_token_logps_and_entropies(
                        self.ref_model, ids, attn, T, batch_size=self.args.per_device_train_batch_size,
                        compute_entropy=True)
                out["ref_per_token_logps"], out["pobench_ref_entropy"] = ref_lp, ref_ent
            # rollout/* as the native loop computes them (every process the same, from gathered values)
            grouped = shaped.view(-1, G)
            self._pb_step_metrics.update({**rollout_summary(grouped, correct, lengths, trunc),
                                          K.SAMPLING_ROUNDS: 1.0, K.KEPT_GROUPS: float(grouped.shape[0])})
            rollout_s = self._pb_step_metrics.get(K.ROLLOUT_S, 0.0)
            self._pb_step_metrics[K.TOKENS_PER_S] = float(lengths.sum()) / max(rollout_s, 1e-9)
            self._pb_step_metrics[K.GEN_TOKENS] = float(lengths.sum())  # one generation per step (support.layout)
            self._pb_entropies = []
            if captured:
                self._pb_entropies = [out["pobench_old_entropy"][mask.bool()].detach().float().cpu()]
            self._pb_entropy_pending = not captured  # on-policy: the first update's entropies are the sampler's
            if rank == 0 and rew["texts"]:
                self.pobench_samples = [{"question": q, "completion": c, "reward": r, "correct": k,
                                         "advantage": float(a)}
                                        for q, c, r, k, a in zip(rew["questions"][:8], rew["texts"][:8],
                                                                 rew["shaped"][:8], rew["correct"][:8],
                                                                 out["advantages"][:8].tolist())]
            return out

        # --- the micro-batches of one optimizer step: their total loss weight, over every process
        def _prepare_inputs(self, generation_batch):
            before = self._buffered_inputs
            inputs = super()._prepare_inputs(generation_batch)
            if self.model.training and self._buffered_inputs is not before:
                ga = self.args.gradient_accumulation_steps
                chunks = self._buffered_inputs
                w = torch.stack([self.objective.loss_weight(c["completion_mask"].float(), c.get("pobench_truncated")
                                                            ).float().reshape(()) for c in chunks])
                totals = w.view(-1, ga).sum(1).to(self.accelerator.device)  # (windows,)
                totals = self.accelerator.reduce(totals, reduction="sum")
                for j, c in enumerate(chunks):
                    c["pobench_weight_total"] = totals[j // ga]
            return inputs

        def pobench_batch(self, inputs, lp, ent) -> PolicyBatch:
            """The PolicyBatch of one micro-batch (per-token tensors of TRL's layout)."""
            mask = inputs["completion_mask"].to(lp.dtype)
            old = inputs.get("old_per_token_logps")
            on_policy = old is None
            old = lp.detach() if on_policy else old
            old_ent = ent.detach() if on_policy else inputs.get("pobench_old_entropy")
            sampler = inputs.get("sampling_per_token_logps", old)
            return batch_for(
                self.objective, "TRL engine", logprobs=lp, old_logprobs=old, advantages=inputs["advantages"],
                mask=mask, max_length=self.max_length, ref_logprobs=inputs.get("ref_per_token_logps"), entropy=ent,
                old_entropy=old_ent, ref_entropy=inputs.get("pobench_ref_entropy"), sampler_logprobs=sampler,
                truncated=inputs.get("pobench_truncated", torch.zeros(mask.shape[0], dtype=torch.bool)))

        def _compute_loss(self, model, inputs):
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            lp, ent, _ = self._get_per_token_logps_and_entropies(model, ids, attn, inputs["completion_ids"].size(1),
                                                                 compute_entropy=True)
            batch = self.pobench_batch(inputs, lp, ent)
            gen = torch.Generator().manual_seed(derive_seed(self.pobench_cfg.seed, "objective", self.state.global_step,
                                                            self._step))
            loss, metrics = self.objective.checked_loss(batch, generator=gen)
            w = float(self.objective.loss_weight(inputs["completion_mask"].float(), inputs.get("pobench_truncated")))
            total = inputs.get("pobench_weight_total")
            scale = 1.0 if total is None else w * self.accelerator.num_processes / float(total)
            if self.model.training:
                self._pb_record(batch, loss, metrics, w)
            return loss * scale

        def _pb_record(self, batch: PolicyBatch, loss, metrics, w: float) -> None:
            self._pb_stats.add(batch, loss, metrics, w)
            if self._pb_entropy_pending:  # on-policy: these are the sampling policy's entropies
                self._pb_entropies.append(batch.entropy.detach()[batch.mask.bool()].float().cpu())

        def _maybe_log_save_evaluate(self, tr_loss, grad_norm, *args, **kwargs):
            if grad_norm is not None:
                self._pb_stats.add_grad_norm(float(grad_norm))
            return super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)

        # --- logging: pobench's metrics, reduced over processes, through self._metrics to every backend
        def pobench_metrics(self) -> dict[str, float]:
            acc = self.accelerator
            stats = self._pb_stats
            if acc.num_processes > 1:  # every process's sums added up (the largest drift taken), then one summary
                from accelerate.utils import gather_object

                keys = sorted(set().union(*gather_object([sorted(stats.sums)])))
                vals = torch.tensor([stats.sums.get(k, 0.0) for k in keys] + [stats.weight, stats.drift_max],
                                    dtype=torch.float64, device=acc.device)
                summed = acc.reduce(vals.clone(), reduction="sum")
                mx = acc.gather(vals[-1:].clone()).max()
                stats = UpdateStats(dict(zip(keys, summed[:-2].tolist())), float(summed[-2]), float(mx),
                                    stats.grad_norms)
            out = stats.summary()
            out[K.LR] = self.lr_scheduler.get_last_lr()[0]
            ent = torch.cat(self._pb_entropies) if self._pb_entropies else torch.zeros(0)
            if acc.num_processes > 1:
                padded = acc.pad_across_processes(ent.to(acc.device), dim=0, pad_index=-1e9)
                ent = acc.gather(padded).cpu()
                ent = ent[ent != -1e9]
            out.update(entropy_summary(ent))
            out.update(self._pb_step_metrics)
            step_s, step_cpu = time.perf_counter() - self._pb_step_start, time.process_time() - self._pb_step_cpu
            self.pobench_elapsed += step_s
            out[K.STEP_S] = step_s
            out[K.ELAPSED_S] = self.pobench_elapsed
            out.update(machine_load())
            if acc.num_processes > 1:  # the CPU time of every process of the step
                step_cpu = float(acc.reduce(torch.tensor([step_cpu], dtype=torch.float64, device=acc.device),
                                            reduction="sum")[0])
            if self.pobench_cpu_s is not None:
                self.pobench_cpu_s += step_cpu
                out[K.CPU_S] = self.pobench_cpu_s
            out[K.UPDATE_S] = step_s - out.get(K.ROLLOUT_S, 0.0)
            out.update(throughput(out.get(K.TOTAL_NUM_TOKENS, 0.0), step_s, acc.num_processes))
            self._pb_stats = UpdateStats()
            return out

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if self.model.training and "loss" in logs:
                for k, v in self.pobench_metrics().items():
                    self._metrics["train"][k] = [v]
            super().log(logs, start_time)

    return PobenchGRPOTrainer
