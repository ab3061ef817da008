"""Distinguishability probe: which objectives of a comparison can differ at all under its training regime.

Two objectives whose gradients w.r.t. the per-token log-probs (and entropies, where an objective differentiates
them) coincide on every batch the loop can produce train identically: no curve can tell them apart, at any scale.
The probe builds one synthetic micro-batch with the regime's properties and compares the gradients:

- **regime**: on-policy (π_old = π_θ: every ratio is exactly 1, as for the first mini-batch of every rollout) or
  off-policy after k optimizer steps (the last mini-batch of a rollout split into μ·M mini-batches has k = μ·M − 1).
  Off-policy, log r = lp − old is drawn heavy-tailed (Cauchy, clamped at |log r| <= 2, scaled so that the mean
  |log r| over completion tokens is k times the per-update drift): at the drift the loop measures this reproduces
  its token clip fractions (0.1-0.5%); entropies of π_old move by the same scale.
- **batch**: ``completions`` completions (one micro-batch: the objectives that select tokens select per micro-batch)
  in whole groups of ``group_size``, prompt-major, given as ``PolicyBatch.group_size`` (TPO's loss couples a
  group); lengths between L_max/4 and L_max (padding to the longest); per-token log-probs mostly
  near 0 with a surprisal tail; entropies correlated with the surprisal; binary rewards at ``accuracy``, turned into
  advantages by each objective's own ``advantages`` hook (so Dr. GRPO's no-std estimator counts); reference
  log-probs / entropies moved from the current policy by ``ref_log_ratio`` (the policy has trained for a while).
  Reward shaping and group filtering (DAPO) change which completions enter a batch, not the gradient on a batch:
  they are reported as rollout-side differences, not compared here.
- **coinciding**: relative L2 difference ‖g_a − g_b‖ / max(‖g_a‖, ‖g_b‖) below ``tolerance`` (default 1e-6), in
  float64; groups are the connected components of that relation.
- **inert terms** (per objective): a coefficient (a ``switch`` field or a ``*_coef`` field) whose term leaves the
  gradient unchanged when set to 0; a clip side that removes no token's gradient (``*clip_frac_low`` /
  ``*clip_frac_high`` metrics = 0); a token selection (other ``*_frac`` metrics) of at most one token of the
  micro-batch (an empty one only when a ``*_frac`` config field asks for a selection); a direct ablation (registered
  with this objective as its base) with the same gradient.

Pure tensors: no bench imports. ``Regime.from_loop`` maps the training loop's settings to a regime (see its doc for
the assumption it makes); the caller may also measure the drift (``train/abs_log_ratio``) and pass it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .advantages import REWARD_COMPONENTS
from .batch import PolicyBatch
from .registry import get_objective, get_spec, list_objectives

#: Mean |log r| per token that one optimizer step adds, per unit of learning rate: measured on the built-in model
#: (bench run defaults: 16x8 rollouts, 4 mini-batches, lr 3e-5, AdamW, grad-norm clip 1; 49-92, mean 62, over grpo /
#: dapo / tepo x 2 seeds), where the 4 mini-batches of a step average 1.5 prior updates; see docs/objectives.md
#: ("Training regime and the distinguishability probe").
#: For other models / optimisers it is an assumption: pass a measured ``log_ratio_per_update`` instead.
LOG_RATIO_PER_LR = 60.0
#: Mean |lp − ref| of the current policy a few steps into training. An assumption (not logged by the loop): its
#: ``train/kl_ref`` (k3) reaches 0.005-0.02 within the default 10 steps; the value only needs to make the KL terms
#: act (their gradient is ~β·(lp − ref)), and the inert-term check reports when one does not.
REF_LOG_RATIO = 0.02
DEFAULT_TOLERANCE = 1e-6
MAX_LOG_RATIO = 2.0  # largest |log r| the probe draws (the loop's train/abs_log_ratio_max stays below ~2)


@dataclass(frozen=True)
class Regime:
    """What the probe batch looks like (see the module doc)."""

    updates_before: int = 0          # k: optimizer steps between sampling and this micro-batch (0 = on-policy)
    log_ratio_per_update: float = LOG_RATIO_PER_LR * 3e-5  # mean |log r| per token one optimizer step adds
    completions: int = 32            # completions in one micro-batch
    group_size: int = 8
    max_length: int = 48             # L_max
    ref_log_ratio: float = REF_LOG_RATIO  # mean |lp − ref|
    accuracy: float = 0.6            # fraction of correct completions (binary rewards)
    seed: int = 0
    source: str = "given"            # how it was derived (shown in reports)

    @property
    def on_policy(self) -> bool:
        return self.updates_before == 0

    @property
    def log_ratio_scale(self) -> float:
        """Mean |log r| per completion token of the probe batch."""
        return self.updates_before * self.log_ratio_per_update

    def describe(self) -> str:
        if self.on_policy:
            return (f"on-policy (ratios exactly 1), micro-batch of {self.completions} completions, "
                    f"L_max {self.max_length}")
        return (f"off-policy after k={self.updates_before} optimizer step(s), mean |log r| "
                f"{self.log_ratio_scale:.3g} ({self.log_ratio_per_update:.3g} per update, {self.source}), "
                f"micro-batch of {self.completions} completions, L_max {self.max_length}")

    @classmethod
    def from_loop(cls, *, update_epochs: int, minibatches: int, lr: float, prompts_per_step: int, group_size: int,
                  micro_batch_size: int, max_new_tokens: int, log_ratio_per_update: float | None = None,
                  seed: int = 0) -> Regime:
        """The regime of the training loop's most off-policy micro-batch.

        A rollout batch feeds μ·M optimizer steps (``update_epochs`` x ``minibatches``); the last mini-batch is
        trained k = μ·M − 1 steps after sampling (k = 0: on-policy, the first mini-batch always is). Assumption: the
        per-token drift grows linearly in k at ``log_ratio_per_update`` = LOG_RATIO_PER_LR x lr (Adam's step is
        roughly proportional to the learning rate) unless a measured value is given.
        """
        k = update_epochs * minibatches - 1
        per_update = log_ratio_per_update if log_ratio_per_update is not None else LOG_RATIO_PER_LR * lr
        per_minibatch = math.ceil(prompts_per_step * group_size / minibatches)
        return cls(updates_before=k, log_ratio_per_update=float(per_update),
                   completions=max(group_size, min(micro_batch_size, per_minibatch)), group_size=group_size,
                   max_length=max_new_tokens, seed=seed,
                   source="measured" if log_ratio_per_update is not None else f"assumed {LOG_RATIO_PER_LR:g} x lr")


# ------------------------------------------------------------------------------------------------ the probe batch
@dataclass
class ProbeBatch:
    """Float64 tensors of one synthetic micro-batch (``rewards`` (P, G); everything else (B, T))."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    entropy: torch.Tensor
    old_entropy: torch.Tensor
    ref_entropy: torch.Tensor
    mask: torch.Tensor
    rewards: torch.Tensor
    max_length: int


def _heavy_tailed(shape: tuple[int, ...], mask: torch.Tensor, mean_abs: float, g: torch.Generator) -> torch.Tensor:
    """Cauchy noise (Student t, 1 d.o.f.) clamped at |x| <= MAX_LOG_RATIO and scaled so that its mean |x| over
    ``mask`` is ``mean_abs``: most tokens barely move, a few move a lot, as the loop measures."""
    t = torch.randn(shape, generator=g, dtype=torch.float64) / torch.randn(shape, generator=g, dtype=torch.float64)
    if mean_abs <= 0:
        return torch.zeros(shape, dtype=torch.float64)
    s = mean_abs
    for _ in range(60):  # fixed point of the scale under the clamp
        x = (t * s).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        s *= mean_abs / max(float((x.abs() * mask).sum() / mask.sum()), 1e-300)
    return (t * s).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO) * mask


def make_batch(regime: Regime) -> ProbeBatch:
    """The probe's micro-batch for ``regime`` (deterministic for ``regime.seed``)."""
    g = torch.Generator().manual_seed(regime.seed)
    G = regime.group_size
    P = max(1, regime.completions // G)
    B, L = P * G, regime.max_length
    lengths = torch.randint(max(1, L // 4), L + 1, (B,), generator=g)
    lengths[0] = L  # one completion runs to the length limit
    T = int(lengths.max())
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)  # (B, T)
    f64 = {"generator": g, "dtype": torch.float64}
    # log-probs: mostly confident tokens, a tail of surprising ones; entropy correlated with the surprisal
    surprise = torch.empty(B, T, dtype=torch.float64).exponential_(1.0 / 0.3, generator=g)
    fork = torch.rand(B, T, **f64) < 0.1
    surprise = torch.where(fork, surprise * 8, surprise)
    lp = -surprise
    ent = 0.6 * surprise + torch.empty(B, T, dtype=torch.float64).exponential_(1.0 / 0.2, generator=g)
    pad = mask == 0
    lp = lp.masked_fill(pad, -7.0)  # garbage on padding: an objective must ignore it
    ent = ent.masked_fill(pad, 3.0)
    # sampling policy: lp − log r (exactly lp on-policy, as the loop does)
    if regime.on_policy:
        old, old_ent = lp.clone(), ent.clone()
    else:
        old = lp - _heavy_tailed((B, T), mask, regime.log_ratio_scale, g)
        old_ent = (ent + regime.log_ratio_scale * torch.randn(B, T, **f64) * (1 + ent) * mask).clamp(min=0)
    # reference policy: a few steps of training away; entropy falls during training on average
    ref = lp - _heavy_tailed((B, T), mask, regime.ref_log_ratio, g)
    ref_ent = (ent + regime.ref_log_ratio * (0.5 + torch.randn(B, T, **f64)) * (1 + ent) * mask).clamp(min=0)
    rewards = (torch.rand(P, G, **f64) < regime.accuracy).to(torch.float64)
    if P > 1:
        rewards[-1] = 1.0  # one all-correct group: zero advantage, as in real batches
    return ProbeBatch(lp, old, ref, ent, old_ent, ref_ent, mask, rewards, L)


# ------------------------------------------------------------------------------------------------ gradients
Entry = tuple[str, str, dict]  # (label, registered name, overrides)


def label_of(name: str, overrides: dict[str, Any]) -> str:
    if not overrides:
        return name
    return f"{name}(" + ", ".join(f"{k}={v}" for k, v in sorted(overrides.items())) + ")"


def _entries(objectives: Sequence[str | tuple]) -> list[Entry]:
    out: list[Entry] = []
    for o in objectives:
        if isinstance(o, str):
            out.append((o, o, {}))
        elif len(o) == 2:
            out.append((label_of(o[0], dict(o[1])), o[0], dict(o[1])))
        else:
            out.append((o[0], o[1], dict(o[2])))
    labels = [e[0] for e in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"probe: duplicate objective labels in {labels}")
    return out


def _advantage_inputs(obj, pb: ProbeBatch) -> dict[str, torch.Tensor]:
    """What the objective's advantage estimator needs beyond the rewards, from the synthetic batch: completion lengths
    (P, G) from the mask, and for ReMax the greedy completion's reward (P,), taken as the group's majority outcome
    (ties: wrong), a stand-in for one more sample of the same policy."""
    needs = obj.advantage_needs
    P, G = pb.rewards.shape
    out: dict[str, torch.Tensor] = {}
    if "lengths" in needs:
        out["lengths"] = pb.mask.sum(-1).view(P, G).to(pb.rewards.dtype)
    if "greedy_rewards" in needs:
        out["greedy_rewards"] = (pb.rewards.mean(-1) > 0.5).to(pb.rewards.dtype)
    if "reward_components" in needs:  # GDPO: the outcome; the format 1 for a right answer and every other wrong one
        fmt = torch.maximum(pb.rewards, (torch.arange(G) % 2 == 0).to(pb.rewards.dtype).expand(P, G))
        parts = {"correct": pb.rewards, "format": fmt, "overlong": torch.zeros_like(pb.rewards)}
        out["reward_components"] = torch.stack([parts[c] for c in REWARD_COMPONENTS], dim=-1)  # (P, G, K)
    unknown = set(needs) - set(out)
    if unknown:
        raise ValueError(f"probe: {obj.name}'s advantage estimator needs {sorted(unknown)}, which the probe cannot "
                         "synthesise")
    return out


def _token_ids(pb: ProbeBatch, vocab: int = 50) -> torch.Tensor:
    """(B, T) synthetic token ids, 0 on padding: random ids from ``vocab`` (a coincidence at one position has
    probability 1/vocab) after a run shared by the group from the start (its first 0..L/8 tokens, a restated question)
    and before one shared to the end (its last 0..L/16 tokens, an answer line): the shared runs GTPO's conflict tokens
    are made of, where completions of both signs meet."""
    g = torch.Generator().manual_seed(1)
    P, G = pb.rewards.shape
    B, T = pb.mask.shape
    lengths = pb.mask.sum(-1).long()
    ids = torch.randint(1, vocab + 1, (B, T), generator=g)
    head = torch.randint(vocab + 1, 2 * vocab, (P, T), generator=g)  # one shared prefix / suffix per group
    tail = torch.randint(vocab + 1, 2 * vocab, (P, T), generator=g)
    for b in range(B):
        n = int(lengths[b])
        k_head = int(torch.randint(0, max(1, T // 8) + 1, (), generator=g))
        k_tail = int(torch.randint(0, max(1, T // 16) + 1, (), generator=g))
        ids[b, :min(k_head, n)] = head[b // G, :min(k_head, n)]
        if k_tail:
            ids[b, max(0, n - k_tail):n] = tail[b // G, T - min(k_tail, n):]
    return ids * pb.mask.long()


def _token_advantages(obj, pb: ProbeBatch) -> torch.Tensor:
    """Per-token advantages of an objective that reads them. When it computes them from per-token statistics
    (``token_advantage_needs``): its ``advantages_from_token_stats`` on the batch's rewards and mask with those
    statistics: π_old's log-probs and entropies, Σ_v π_old² synthesised from H_old as exp(−H_old) (Σπ² = exp(−H₂) >=
    exp(−H)), kept inside what a distribution with π_old(y) can have, [π², π² + (1 − π)²], and token ids with shared
    runs from the start and the end of each group (``_token_ids``). With a critic (PPO), from synthetic values: a
    critic that has learned each prompt's success rate (its group's mean reward) up to per-token noise of 0.1 (an
    untrained critic, V ≡ 0, would make GAE with γ = λ = 1 REINFORCE++'s whitened reward)."""
    P, G = pb.rewards.shape
    if needs := obj.token_advantage_needs:
        p = pb.old_logprobs.exp()
        s2 = torch.minimum(torch.maximum(torch.exp(-pb.old_entropy), p.square()), p.square() + (1 - p).square())
        stats = {"old_logprobs": pb.old_logprobs, "sum_pi_squared": s2 * pb.mask,
                 "old_entropy": pb.old_entropy * pb.mask}
        if "token_ids" in needs:
            stats["token_ids"] = _token_ids(pb)
        unknown = set(needs) - set(stats)
        if unknown:
            raise ValueError(f"probe: {obj.name}'s per-token advantages need {sorted(unknown)}, which the probe "
                             "cannot synthesise")
        return obj.advantages_from_token_stats(pb.rewards.reshape(-1), pb.mask, group_size=G,
                                               **{n: stats[n] for n in needs})
    g = torch.Generator().manual_seed(0)
    values = pb.rewards.mean(-1, keepdim=True).expand(P, G).reshape(-1, 1) + 0.1 * torch.randn(
        pb.mask.shape, generator=g, dtype=torch.float64)
    return obj.advantages_from_values(pb.rewards.reshape(-1), values * pb.mask, pb.mask)[0]


def _gradient_one(name: str, overrides: dict[str, Any], pb: ProbeBatch, seed: int
                  ) -> tuple[torch.Tensor, dict[str, float]]:
    obj = get_objective(name, **overrides)
    if (state := obj.probe_state()) is not None:  # a stateful objective where its state acts (not its initial one)
        obj.restore_state(state)
    adv = obj.advantages(pb.rewards, **_advantage_inputs(obj, pb)).reshape(-1).to(torch.float64)  # (B,)
    lp = pb.logprobs.clone().requires_grad_(True)
    ent = pb.entropy.clone().requires_grad_(True)
    token_adv = _token_advantages(obj, pb) if obj.uses_token_advantages else None
    batch = PolicyBatch(logprobs=lp, old_logprobs=pb.old_logprobs, advantages=adv, mask=pb.mask,
                        max_length=pb.max_length, ref_logprobs=pb.ref_logprobs, entropy=ent,
                        old_entropy=pb.old_entropy, ref_entropy=pb.ref_entropy, token_advantages=token_adv,
                        group_size=pb.rewards.shape[1])  # (whole groups, prompt-major: TPO's softmax reads them)
    loss, metrics = obj.checked_loss(batch, generator=torch.Generator().manual_seed(seed))
    g_lp, g_ent = torch.autograd.grad(loss, [lp, ent], allow_unused=True)
    g_lp = torch.zeros_like(lp) if g_lp is None else g_lp
    g_ent = torch.zeros_like(ent) if g_ent is None else g_ent
    return torch.cat([g_lp.flatten(), g_ent.flatten()]).detach(), {k: float(v) for k, v in metrics.items()}


def gradient(name: str, overrides: dict[str, Any], batches: Sequence[ProbeBatch], seed: int = 0
             ) -> tuple[torch.Tensor, dict[str, float]]:
    """Gradients of ``name``'s loss w.r.t. (log-probs, entropies) on each probe micro-batch, concatenated, and its
    metrics averaged over the micro-batches."""
    grads, sums = [], {}
    for i, pb in enumerate(batches):
        g, m = _gradient_one(name, overrides, pb, seed + i)
        n = float(pb.mask.sum())
        m.update({f"count:{k}": v * n for k, v in m.items() if k.endswith("_frac")})  # tokens per micro-batch
        grads.append(g)
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v / len(batches)
    return torch.cat(grads), sums


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / max(‖a‖, ‖b‖); 0 when both are zero."""
    denom = max(float(a.norm()), float(b.norm()))
    return 0.0 if denom == 0 else float((a - b).norm()) / denom


# ------------------------------------------------------------------------------------------------ the report
@dataclass
class ProbeResult:
    regime: Regime
    tolerance: float
    labels: list[str]
    distance: dict[tuple[str, str], float]          # (a, b) with a before b in ``labels`` -> relative difference
    groups: list[list[str]]                         # coinciding groups (size >= 2), in label order
    inert: dict[str, list[str]]                     # label -> inert terms, in words
    metrics: dict[str, dict[str, float]]            # label -> the objective's metrics on the probe batch
    rollout_side: dict[str, list[str]] = field(default_factory=dict)  # label -> rollout hooks switched on
    tokens: int = 0
    no_clip: list[str] = field(default_factory=list)  # labels whose policy term has no clip (``has_clip`` False)

    def dist(self, a: str, b: str) -> float:
        return self.distance.get((a, b), self.distance.get((b, a), 0.0))

    def nearest(self, label: str) -> tuple[str | None, float]:
        others = [(o, self.dist(label, o)) for o in self.labels if o != label]
        return min(others, key=lambda x: x[1]) if others else (None, float("nan"))

    @property
    def coinciding_pairs(self) -> list[tuple[str, str]]:
        return [p for p, d in self.distance.items() if d < self.tolerance]

    def warnings(self) -> list[str]:
        """One line per coinciding group and per inert term (with the objectives it applies to); empty when every
        objective is distinguishable and no term is inert."""
        out = []
        for grp in self.groups:
            hooks = {lab: self.rollout_side.get(lab, []) for lab in grp}
            extra = "" if not any(hooks.values()) else " (they differ only in rollout-side hooks: " + "; ".join(
                f"{lab}: {', '.join(h)}" for lab, h in hooks.items() if h) + ")"
            out.append(f"same gradient (relative difference < {self.tolerance:g}): {' == '.join(grp)}{extra}")
        by_reason: dict[str, list[str]] = {}
        for lab in self.labels:
            for reason in self.inert.get(lab, []):
                by_reason.setdefault(reason, []).append(lab)
        for reason, labs in by_reason.items():
            out.append(f"inert in {', '.join(labs)}: {reason}")
        return out

    def rows(self) -> list[list[str]]:
        """The "what differs" table: objective, same gradient as, nearest other objective, clip binds, inert terms."""
        out = []
        for lab in self.labels:
            same = next((g for g in self.groups if lab in g), [])
            near, d = self.nearest(lab)
            m = {k: v for k, v in self.metrics.get(lab, {}).items() if not k.startswith("count:")}
            low = next((v for k, v in m.items() if k.endswith("clip_frac_low")), None)
            high = next((v for k, v in m.items() if k.endswith("clip_frac_high")), None)
            clip = ("no clip" if lab in self.no_clip else "n/a" if low is None
                    else f"{100 * low:.2f}% / {100 * high:.2f}%")
            out.append([lab, ", ".join(x for x in same if x != lab) or "none",
                        "n/a" if near is None else f"{near} ({d:.2g})", clip,
                        "; ".join(self.inert.get(lab, [])) or "none"])
        return out

    HEADER = ["objective", "same gradient as", "nearest other (rel. L2 diff.)", "clip binds low / high",
              "inert terms"]

    def text(self) -> str:
        lines = [f"Distinguishability probe: {self.regime.describe()}; {self.tokens} completion tokens; "
                 f"tolerance {self.tolerance:g} (relative L2 difference of the gradients w.r.t. log-probs and "
                 f"entropies)."]
        widths = [max(len(r[i]) for r in [self.HEADER, *self.rows()]) for i in range(len(self.HEADER))]
        for r in [self.HEADER, *self.rows()]:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        warn = self.warnings()
        lines.append("" if warn else "Every pair of objectives has a different gradient; no inert term found.")
        lines += [f"WARNING: {w}" for w in warn]
        return "\n".join(lines).rstrip() + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {"regime": dataclasses.asdict(self.regime), "tolerance": self.tolerance, "labels": self.labels,
                "groups": self.groups, "inert": self.inert, "rollout_side": self.rollout_side,
                "tokens": self.tokens, "header": self.HEADER, "rows": self.rows(),
                "distance": {f"{a}|{b}": d for (a, b), d in self.distance.items()}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def _switches(config) -> list[tuple[str, float]]:
    out = []
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        if (f.metadata.get("switch") or f.name.endswith("_coef")) and isinstance(v, float) and v != 0:
            out.append((f.name, v))
    return out


ROLLOUT_HOOKS = ("dynamic_sampling", "overlong_shaping")


def _inert_terms(name: str, overrides: dict, pb: Sequence[ProbeBatch], grad: torch.Tensor, metrics: dict[str, float],
                 tol: float, ablations: bool, seed: int) -> list[str]:
    out = []
    obj = get_objective(name, **overrides)
    config = obj.config
    n_tokens = sum(float(b.mask.sum()) for b in pb) / len(pb)  # per micro-batch
    for f, v in _switches(config):
        try:
            g0, _ = gradient(name, {**overrides, f: 0.0}, pb, seed)
        except ValueError:
            continue
        if relative_difference(grad, g0) < tol:
            out.append(f"{f}={v:g} (its term leaves the gradient unchanged: same as {f}=0)")
    for key, v in metrics.items():
        if key.startswith("count:"):
            continue
        short = key.rsplit("/", 1)[-1]
        if short in ("clip_frac_low", "clip_frac_high") and v == 0 and obj.has_clip:
            other = key[: -len("low")] + "high" if short.endswith("low") else key[: -len("high")] + "low"
            if metrics.get(other, 1.0) == 0:
                if short.endswith("low"):
                    out.append("clip never binds (clip_frac_low = clip_frac_high = 0)")
                continue
            side = "lower" if short.endswith("low") else "upper"
            out.append(f"{side} clip never binds ({short} = 0)")
        elif short.endswith("_frac") and not short.startswith("clip_frac"):
            count = metrics.get(f"count:{key}", v * n_tokens)
            # an empty selection counts when the config asks for one (a `*_frac` field > 0); otherwise it belongs to
            # a term that is off (TEPO's mask with β = 0) or is caught by the switch-off comparison above
            asked = any(f.name.endswith("_frac") and getattr(config, f.name) for f in dataclasses.fields(config))
            if count <= 1 + 1e-9 and (count > 0 or asked):
                out.append(f"{short}: selects {count:.2g} of ~{n_tokens:.0f} tokens per micro-batch")
    if ablations:
        for abl in list_objectives():
            spec = get_spec(abl)
            if spec.base != name or set(overrides) & set(spec.defaults):
                continue
            try:
                ga, _ = gradient(abl, overrides, pb, seed)
            except ValueError:
                continue
            if relative_difference(grad, ga) < tol:
                out.append(f"same gradient as its ablation {abl} ({spec.description})")
    return out


def probe(objectives: Sequence[str | tuple], regime: Regime | None = None, *, tolerance: float = DEFAULT_TOLERANCE,
          ablations: bool = True, batches: int = 4) -> ProbeResult:
    """Compare the gradients of ``objectives`` (names, ``(name, overrides)`` or ``(label, name, overrides)``) on
    ``batches`` independent probe micro-batches of ``regime`` (default: the default regime, off-policy)."""
    regime = regime or Regime(updates_before=3)
    entries = _entries(objectives)
    pb = [make_batch(dataclasses.replace(regime, seed=regime.seed + i)) for i in range(batches)]
    grads, metrics, inert, hooks = {}, {}, {}, {}
    for label, name, ov in entries:
        grads[label], metrics[label] = gradient(name, ov, pb, regime.seed)
        config = get_objective(name, **ov).config
        hooks[label] = [h for h in ROLLOUT_HOOKS if getattr(config, h, False)]
    labels = [e[0] for e in entries]
    distance = {(a, b): relative_difference(grads[a], grads[b]) for i, a in enumerate(labels) for b in labels[i + 1:]}
    parent = {lab: lab for lab in labels}

    def root(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for (a, b), d in distance.items():
        if d < tolerance:
            parent[root(b)] = root(a)
    comps: dict[str, list[str]] = {}
    for lab in labels:
        comps.setdefault(root(lab), []).append(lab)
    groups = [g for g in comps.values() if len(g) > 1]
    for label, name, ov in entries:
        inert[label] = _inert_terms(name, ov, pb, grads[label], metrics[label], tolerance, ablations, regime.seed)
    no_clip = [label for label, name, ov in entries if not get_objective(name, **ov).has_clip]
    return ProbeResult(regime, tolerance, labels, distance, groups, inert, metrics, hooks,
                       int(sum(float(b.mask.sum()) for b in pb)), no_clip)
