"""GTPO (Simoni, Fontana, Rossolini, Saracino, Mori, arXiv 2508.03772), as its authors' code computes it
(github.com/winstonsmith1897/GTPO ``gtpo/gtpo_training.py``: ``build_conflict_mask``, the entropy shaping of
``UnslothEfficientGTPO``, ``gtpo_compute_loss``; docs/objectives.md has the reading and what is ours).

Per group of G completions, at rollout time (``advantages_from_token_stats``, over whole groups, after π_old's scoring
pass):

- Â_i = R_i − mean_g R (no std division);
- conflict tokens: position t of a completion with Â_i ≠ 0 is a forward conflict when its token id occurs at position
  t in a completion with Â > 0 and in one with Â < 0, and so does every earlier position of completion i (the shared
  run from the start); backward conflicts the same with positions counted back from each completion's last token;
- δ_it = δ^fwd_it · δ^bwd_it, each 1 off its conflicts, ``conflict_weight`` (W_RAW = 2) on a conflict of a completion
  with Â > 0 and ``conflict_weight_neg`` (0) on one with Â < 0;
- entropy filter: H̄_i, the mean over completion i's tokens of π_old's full-vocabulary entropy;
  Â_i ← Â_i − ``entropy_scale``·H̄_i when H̄_i ≤ ``entropy_threshold``, else 0 (every completion, Â_i = 0 included);
- Â_it = Â_i · δ_it / max(1, n_i), n_i the number of completion i's tokens that are forward or backward conflicts.

Loss: −Â_it · r_it, r = π_θ/π_old without clip (on-policy r = π_θ/sg(π_θ), the code's REINFORCE), no KL, per
completion the token mean, then the mean over completions (``seq-mean-token-mean``; the code sums them: a constant
factor).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .aggregation import AGGREGATIONS
from .base import param
from .policy_gradient import PGConfig, PolicyGradient

PAPER = "arXiv 2508.03772"
#: the constants of the authors' code (gtpo/gtpo_training.py): W_RAW, ENT_THRESHOLD, ENT_SCALE
W_RAW, ENT_THRESHOLD, ENT_SCALE = 2.0, 0.7, 0.1


@dataclass(frozen=True)
class GTPOConfig(PGConfig):
    aggregation: str = param("seq-mean-token-mean", "How per-token terms are reduced to the loss (GTPO's code: token "
                             "mean per completion; it sums over completions, we average).", paper=PAPER,
                             choices=AGGREGATIONS)
    advantage_estimator: str = param("group-no-std", "Â_i = R_i − mean_g R (GTPO's code: its std division is "
                                     "commented out); the only value GTPO takes.", paper=PAPER,
                                     choices=("group-no-std",))
    kl_coef: float = param(0.0, "β: weight of the per-token KL to the reference policy (GTPO's code: beta 0).",
                           paper=PAPER, search=(1e-3, 1e-1, True), switch=True)
    conflict_weight: float = param(W_RAW, "δ on a conflict token of a completion with Â > 0 (W_RAW), per direction "
                                   "(forward and backward multiply).", paper=PAPER, search=(1.0, 4.0, False))
    conflict_weight_neg: float = param(0.0, "δ on a conflict token of a completion with Â < 0, per direction (the "
                                       "code: 0, the shared token is not pushed down).", paper=PAPER)
    entropy_threshold: float = param(ENT_THRESHOLD, "A completion whose mean π_old entropy H̄_i exceeds it leaves the "
                                     "update (Â_i ← 0; ENT_THRESHOLD).", paper=PAPER, search=(0.2, 3.0, True))
    entropy_scale: float = param(ENT_SCALE, "Â_i ← Â_i − scale·H̄_i for the completions kept (ENT_SCALE).",
                                 paper=PAPER, search=(0.01, 0.5, True))

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_nonneg("conflict_weight", "conflict_weight_neg", "entropy_threshold", "entropy_scale")
        if self.ratio_level != "token":
            self._bad("ratio_level", "GTPO's advantages are per token: must be 'token'")
        if self.off_policy_mask_threshold != 0:
            self._bad("off_policy_mask_threshold", "the off-policy sequence mask reads one advantage per completion, "
                                                   "and GTPO's are per token; leave it at 0")


def group_centred(rewards: torch.Tensor) -> torch.Tensor:
    """(P, G) rewards -> R − mean_g R, exactly 0 in a group whose rewards are all equal (no rounding residue)."""
    flat = (rewards.max(-1, keepdim=True).values - rewards.min(-1, keepdim=True).values) == 0
    return torch.where(flat, torch.zeros_like(rewards), rewards - rewards.mean(-1, keepdim=True))


def _reverse(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(…, T) rows whose first ``lengths`` entries are reversed in place (position t <-> length − 1 − t); padding
    stays where it is. Its own inverse."""
    T = x.shape[-1]
    t = torch.arange(T, device=x.device)
    idx = torch.where(t < lengths[..., None], lengths[..., None] - 1 - t, t)
    return x.gather(-1, idx)


def _shared_run(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """(P, G, T) bool: the conflict run from the start. Position t of completion i (with Â ≠ 0) is a raw conflict
    when ids[i, t] is at position t of a completion with Â > 0 and of one with Â < 0; the run keeps the raw conflicts
    whose every earlier position is one."""
    m = mask > 0
    same = (ids[:, :, None, :] == ids[:, None, :, :]) & m[:, None, :, :]  # (P, G_i, G_j, T)
    in_pos = (same & pos[:, None, :, None]).any(2)
    in_neg = (same & neg[:, None, :, None]).any(2)
    raw = in_pos & in_neg & m & (pos | neg)[..., None]
    return raw.to(torch.int64).cumprod(-1).bool()


def conflict_masks(ids: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, G, T) token ids, their mask and (P, G) advantages -> (forward, backward) (P, G, T) bool conflict masks."""
    pos, neg = adv > 0, adv < 0
    fwd = _shared_run(ids, mask, pos, neg)
    lengths = (mask > 0).sum(-1)
    bwd = _reverse(_shared_run(_reverse(ids, lengths), _reverse(mask, lengths), pos, neg), lengths)
    return fwd, bwd


def gtpo_advantages(rewards: torch.Tensor, token_ids: torch.Tensor, mask: torch.Tensor, old_entropy: torch.Tensor,
                    *, conflict_weight: float = W_RAW, conflict_weight_neg: float = 0.0,
                    entropy_threshold: float = ENT_THRESHOLD, entropy_scale: float = ENT_SCALE
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(P, G) rewards, (P, G, T) token ids, mask and π_old entropies -> ((P, G, T) per-token advantages
    Â'_i·δ_it / max(1, n_i), 0 on padding; the intermediate quantities, for tests and metrics: ``adv`` Â_i,
    ``forward`` / ``backward`` conflict masks, ``delta`` δ_it, ``n_conflict`` n_i, ``entropy`` H̄_i, ``shaped`` Â'_i)."""
    dtype = old_entropy.dtype if old_entropy.is_floating_point() else torch.float32
    m = (mask > 0).to(dtype)
    adv = group_centred(rewards.to(dtype))
    fwd, bwd = conflict_masks(token_ids, mask, adv)
    pos = (adv > 0)[..., None]

    def weight(conflict: torch.Tensor) -> torch.Tensor:
        on = torch.where(pos, torch.full_like(m, conflict_weight), torch.full_like(m, conflict_weight_neg))
        return torch.where(conflict, on, torch.ones_like(m))

    delta = weight(fwd) * weight(bwd) * m
    n_conflict = ((fwd | bwd) & (m > 0)).sum(-1).clamp(min=1).to(dtype)  # (P, G)
    h_bar = (old_entropy.to(dtype) * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # (P, G)
    shaped = torch.where(h_bar <= entropy_threshold, adv - entropy_scale * h_bar, torch.zeros_like(adv))
    tok = shaped[..., None] * delta / n_conflict[..., None]
    return tok, {"adv": adv, "forward": fwd, "backward": bwd, "delta": delta, "n_conflict": n_conflict,
                 "entropy": h_bar, "shaped": shaped}


class GTPO(PolicyGradient):
    """GTPO: per-token advantages from conflict tokens and an entropy filter over whole groups at rollout time
    (``advantages_from_token_stats``), then an unclipped ratio surrogate −Â_it·r_it."""

    config_class = GTPOConfig
    policy_term_vanishes_at_zero_advantage = True  # −Â_it·r_it: 0 on the tokens with Â_it = 0

    @property
    def has_clip(self) -> bool:
        return False  # (no clip: its clip fractions are 0 by construction)

    @property
    def uses_token_advantages(self) -> bool:
        return True

    @property
    def token_advantage_needs(self) -> tuple[str, ...]:
        return ("token_ids", "old_entropy")

    def token_advantage_refusal(self) -> str | None:
        return "GTPO's per-token advantages are its own (conflict tokens and entropy filter over the group)"

    def advantages(self, rewards: torch.Tensor, *, lengths: torch.Tensor | None = None,
                   greedy_rewards: torch.Tensor | None = None) -> torch.Tensor:
        """Â_i = R_i − mean_g R (the per-token advantages come once π_old has scored the rollout)."""
        return group_centred(rewards)

    def advantages_from_token_stats(self, rewards: torch.Tensor, mask: torch.Tensor,
                                    old_logprobs: torch.Tensor | None = None,
                                    sum_pi_squared: torch.Tensor | None = None, *, group_size: int,
                                    is_weights: torch.Tensor | None = None, old_entropy: torch.Tensor | None = None,
                                    token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(N,) shaped rewards (prompt-major), (N, T) mask, token ids and π_old entropies -> (N, T) GTPO advantages
        (``gtpo_advantages`` on the rows grouped (P, G, T)). Rollout-correction IS weights are not read here: the
        loss applies them per token, as for every PolicyGradient."""
        if old_entropy is None or token_ids is None:
            raise ValueError(f"objective {self.name!r}: advantages_from_token_stats needs token_ids and old_entropy")
        N, T = mask.shape
        if group_size < 1 or N % group_size:
            raise ValueError(f"advantages_from_token_stats: {N} completions do not split into groups of {group_size}")
        c = self.config
        shape = (N // group_size, group_size, T)
        tok, _ = gtpo_advantages(rewards.reshape(shape[:2]), token_ids.reshape(shape), mask.reshape(shape),
                                 old_entropy.reshape(shape), conflict_weight=c.conflict_weight,
                                 conflict_weight_neg=c.conflict_weight_neg, entropy_threshold=c.entropy_threshold,
                                 entropy_scale=c.entropy_scale)
        return tok.reshape(N, T)

    def policy_term(self, batch, ratio, adv, is_w):
        z = torch.zeros_like(batch.mask, dtype=torch.bool)
        return -ratio * adv, z, z, {}
