"""The critic of an objective that declares one (``Objective.critic``, a ``CriticSpec``: PPO's value function), in the
native loop: built from the policy, scored before each update, trained on the objective's ``value_loss``, and saved /
restored with every checkpoint (``critic.pt``). Objectives without a critic never reach this module.

The value model is a deep copy of the policy's backbone (its initial weights; with LoRA, the base weights with the
adapter merged) and a scalar head ``Linear(hidden, 1)`` initialised to 0, so V ≡ 0 before its first step and building
it draws no random numbers. V(s_t) is read at the position whose hidden state predicts completion token t (the
position ``bench.rollout.scoring`` reads log π(y_t) from), with the same layout: left-padded prompts, right-padded
completions, positions over real tokens.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from algorithms import CriticSpec, aggregation_weight
from algorithms.critic import explained_variance
from bench.data import derive_seed
from bench.engines.base import TrainingDiverged
from bench.engines.native.scale import is_peft
from bench.rollout.scoring import layout

MODELS = ("policy-copy",)


class ValueModel(torch.nn.Module):
    """A causal LM backbone and a scalar value head: (B, L) tokens -> (B, L) values."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        p = next(backbone.parameters())
        self.head = torch.nn.Linear(hidden_size, 1, dtype=p.dtype, device=p.device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False).last_hidden_state
        return self.head(hidden).squeeze(-1).float()


class Critic:
    """The value model, its AdamW optimizer (constant learning rate) and the spec that configured them."""

    def __init__(self, policy: torch.nn.Module, spec: CriticSpec) -> None:
        if spec.model not in MODELS:
            raise ValueError(f"critic model {spec.model!r}: the native loop builds {', '.join(MODELS)}")
        net = copy.deepcopy(policy)
        if is_peft(net):
            net = net.merge_and_unload()
        if not hasattr(net, "get_decoder"):
            raise ValueError(f"the critic needs the policy's backbone: {type(net).__name__} has no get_decoder()")
        self.spec = spec
        self.model = ValueModel(net.get_decoder(), net.config.hidden_size).requires_grad_(True)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)

    def values(self, prompts: list[list[int]], completions: list[list[int]], grad: bool
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(values (B, T), mask (B, T)) of the completions, 0 on padding; with the critic's gradient when ``grad``."""
        device = next(self.model.parameters()).device
        ids, attn, pos, lp, _ = layout(prompts, completions, device=device)
        with torch.set_grad_enabled(grad):
            v = self.model(ids, attn, pos)[:, lp - 1:-1]  # the positions that predict completion tokens 0 .. T-1
            mask = attn[:, lp:].to(torch.float32)
            return v * mask, mask

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def score_values(critic: Critic, prompts: list[list[int]], completions: list[list[int]], mb: int
                 ) -> list[torch.Tensor]:
    """Per-completion 1-D values V(s_t) (no gradient), scored in micro-batches of similar lengths, in input order."""
    n = len(completions)
    order = sorted(range(n), key=lambda i: (len(completions[i]), len(prompts[i])))
    out: list[torch.Tensor] = [torch.zeros(0)] * n
    for s in range(0, n, mb):
        rows = order[s:s + mb]
        v, _ = critic.values([prompts[i] for i in rows], [completions[i] for i in rows], grad=False)
        for j, i in enumerate(rows):
            out[i] = v[j, : len(completions[i])].cpu()
    return out


def update_critic(cfg, objective, critic: Critic, prompts, completions, old_values: torch.Tensor,
                  returns: torch.Tensor, mask: torch.Tensor, step: int) -> dict[str, float]:
    """The critic's update on the step's rollouts: μ epochs x minibatches (the policy's), each one optimizer step
    gradient-accumulated over micro-batches weighted as the objective's aggregation weighs them; returns the
    ``critic/*`` metrics (weighted means over the micro-batches, the explained variance of the values the advantages
    were computed from)."""
    N = len(completions)
    spec, mb = critic.spec, cfg.micro_batch_size
    params = [p for p in critic.model.parameters() if p.requires_grad]
    sums: dict[str, float] = {}
    weight = 0.0
    norms: list[float] = []
    for epoch in range(cfg.update_epochs):
        order = torch.randperm(N, generator=torch.Generator().manual_seed(derive_seed(cfg.seed, "critic-perm", step,
                                                                                        epoch)))
        for minibatch in torch.tensor_split(order, min(cfg.minibatches, N)):
            parts = torch.split(minibatch, mb)
            w = [float(aggregation_weight(mask[idx], objective.config.aggregation)) for idx in parts]
            w_total = sum(w)
            critic.optimizer.zero_grad(set_to_none=True)
            for k, idx in enumerate(parts):
                ids = idx.tolist()
                v, m = critic.values([prompts[i] for i in ids], [completions[i] for i in ids], grad=True)
                T = m.shape[1]
                loss, metrics = objective.value_loss(v, returns[ids, :T].to(v.device), old_values[ids, :T].to(v.device),
                                                     m, cfg.max_new_tokens)
                if not torch.isfinite(loss):
                    raise TrainingDiverged(f"step {step}: the critic's value loss is {float(loss.detach())}")
                (loss * (w[k] / w_total if w_total > 0 else 0.0)).backward()
                for key, val in metrics.items():
                    sums[key] = sums.get(key, 0.0) + float(val) * w[k]
                weight += w[k]
            limit = spec.max_grad_norm if spec.max_grad_norm > 0 else float("inf")
            norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
            if not math.isfinite(norm):
                raise TrainingDiverged(f"step {step}: the critic's gradient norm is {norm} (critic/grad_norm)")
            norms.append(norm)
            critic.optimizer.step()
    out = {k: v / weight for k, v in sums.items()} if weight > 0 else {}
    out["critic/grad_norm"] = sum(norms) / len(norms) if norms else 0.0
    out["critic/explained_var"] = float(explained_variance(old_values, returns, mask))
    out["critic/lr"] = spec.lr
    return out
