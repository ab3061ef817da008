"""A learned value function's side of PPO: per-token GAE advantages and returns, the clipped value loss, and what an
engine needs to know about the critic an objective asks for (``CriticSpec``). Pure torch; no engine imports.

Shapes: B completions padded to T tokens (completion positions only), ``mask`` 1 on completion tokens. ``values``
V(s_t) is the critic's estimate at the state that emits token t (the same position whose logits give log π(y_t)).

- outcome reward: r_t = R_i on the completion's last token, 0 elsewhere (``outcome_token_rewards``);
- TD error δ_t = r_t + γ·V(s_{t+1}) − V(s_t), with V = 0 after the last token (no bootstrap past the completion);
- GAE Â_t = δ_t + γλ·Â_{t+1} (Schulman et al., arXiv 1506.02438), returns G_t = Â_t + V(s_t) (before whitening);
- whitening (verl ``masked_whiten``): Â ← (Â − mean) / sqrt(var + 1e-8), mean and Bessel-corrected variance over
  every completion token of the batch (padding excluded);
- value loss ½·agg(max((V_θ − G)², (clip(V_θ, V_old − c, V_old + c) − G)²)), aggregated over completion tokens as
  the objective aggregates its policy loss (verl ``compute_value_loss``: the critic's loss_agg_mode follows the
  actor's).

Positions outside ``mask`` are skipped: a gap inside a completion carries the next value and the running advantage
through it, as verl does; the advantages and returns returned are 0 there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .aggregation import aggregate, masked_mean

WHITEN_EPS = 1e-8  # verl's masked_whiten


@dataclass(frozen=True)
class CriticSpec:
    """The critic an objective asks the engine to build, train, checkpoint and restore.

    ``model``: ``policy-copy``, the policy's architecture and initial weights (its backbone) with a scalar value head
    in place of the LM head, the head initialised to 0 (V ≡ 0 before the first critic step); its own AdamW optimizer
    at ``lr`` / ``weight_decay`` (constant learning rate), gradient norm clipped at ``max_grad_norm`` (0: no clip);
    ``warmup_steps``: the first training steps train the critic only (the policy is not updated). It sees the same
    epochs and minibatches as the policy."""

    lr: float
    weight_decay: float = 0.01
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    model: str = "policy-copy"


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) outcome rewards -> (B, T): each reward on its completion's last token (the last position of ``mask``), 0
    elsewhere; a completion without tokens gets none."""
    if rewards.shape != mask.shape[:1]:
        raise ValueError(f"rewards must have shape ({mask.shape[0]},), got {tuple(rewards.shape)}")
    m = mask > 0
    T = mask.shape[1]
    last = torch.where(m, torch.arange(T, device=mask.device), -1).max(-1).values  # (B,): -1 when empty
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=mask.device)
    rows = (last >= 0).nonzero(as_tuple=True)[0]
    out[rows, last[rows]] = rewards[rows]
    return out


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = WHITEN_EPS) -> torch.Tensor:
    """(values − mean) / sqrt(var + eps) with mean and Bessel-corrected variance over the positions of ``mask`` (a
    single position: variance without correction); 0 outside the mask."""
    m = mask.to(values.dtype)
    n = m.sum()
    mean = (values * m).sum() / n.clamp(min=1.0)
    var = (((values - mean) ** 2) * m).sum() / n.clamp(min=1.0)
    var = var * n / (n - 1).clamp(min=1.0)
    return torch.where(m > 0, (values - mean) * torch.rsqrt(var + eps), torch.zeros_like(values))


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0,
        whiten: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both (B, T) and constants: GAE over each completion's tokens (module docstring), the
    returns Â + V before whitening, the advantages whitened over the batch's completion tokens when ``whiten``."""
    if not (token_rewards.shape == values.shape == mask.shape) or values.dim() != 2:
        raise ValueError(f"token_rewards, values and mask must share one (B, T) shape, got "
                         f"{tuple(token_rewards.shape)}, {tuple(values.shape)}, {tuple(mask.shape)}")
    with torch.no_grad():
        r, v = token_rewards.detach(), values.detach()
        live = mask > 0
        B, T = v.shape
        adv = torch.zeros_like(v)
        following_value = torch.zeros(B, dtype=v.dtype, device=v.device)  # V(s_{t+1}); 0 past the last token
        following_adv = torch.zeros(B, dtype=v.dtype, device=v.device)  # Â_{t+1}
        for t in range(T - 1, -1, -1):
            here = live[:, t]
            a_t = r[:, t] + gamma * following_value - v[:, t] + gamma * lam * following_adv
            following_adv = torch.where(here, a_t, following_adv)
            following_value = torch.where(here, v[:, t], following_value)
            adv[:, t] = following_adv
        zero = torch.zeros_like(v)
        returns = torch.where(live, adv + v, zero)
        adv = masked_whiten(adv, mask) if whiten else torch.where(live, adv, zero)
    return adv, returns


def value_loss(vpreds: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor, mask: torch.Tensor,
               clip: float, aggregation: str = "token-mean", max_length: int = 1
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped value loss ½·agg(max((V_θ − G)², (clip(V_θ, V_old ± c) − G)²)) (module docstring) and its metrics
    (``critic/*``: the fraction of tokens where the clipped term is the larger, the values, the explained variance).
    ``vpreds`` carries the critic's gradient; ``returns`` and ``old_values`` are constants. ``clip`` 0: no clip."""
    m = mask.to(vpreds.dtype)
    on = m > 0  # what padding holds (garbage, NaN) never enters the loss or its gradient
    vpreds = torch.where(on, vpreds, torch.zeros_like(vpreds))
    returns, old_values = (torch.where(on, x.detach(), torch.zeros_like(vpreds)) for x in (returns, old_values))
    unclipped = (vpreds - returns) ** 2
    if clip > 0:
        clipped = (torch.clamp(vpreds, old_values - clip, old_values + clip) - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clip_frac = masked_mean((clipped > unclipped).to(m.dtype), m)
    else:
        per_token, clip_frac = unclipped, torch.zeros((), dtype=m.dtype)
    loss = 0.5 * aggregate(per_token, m, aggregation, max_length)
    metrics = {"critic/value_loss": loss.detach(), "critic/value_clip_frac": clip_frac.detach(),
               "critic/value_mean": masked_mean(vpreds.detach(), m), "critic/return_mean": masked_mean(returns, m)}
    return loss, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 − Var(G − V) / Var(G) over the completion tokens (1: V predicts G exactly; 0: no better than the mean;
    NaN when the returns do not vary)."""
    m = mask.to(returns.dtype)
    n = m.sum().clamp(min=1.0)

    def var(x: torch.Tensor) -> torch.Tensor:
        x = torch.where(m > 0, x, torch.zeros_like(x))
        mean = x.sum() / n
        return (((x - mean) ** 2) * m).sum() / n

    total = var(returns)
    return 1.0 - var(returns - values) / total if total > 0 else torch.full((), float("nan"), dtype=returns.dtype)
