"""Advantage estimators from grouped scalar rewards (one group = the G completions of one prompt).

Every estimator maps (P, G) rewards to (P, G) advantages, one value per completion (outcome rewards: the advantage
is the same for every token of a completion). Some need more than the rewards; ``ESTIMATOR_NEEDS`` declares it, and
the training loop provides exactly what the selected estimator declares (no branching on names):

- ``lengths``: (P, G) completion lengths |y_i| (OPO's length-weighted baseline; REINFORCE++'s token-weighted
  batch whitening);
- ``greedy_rewards``: (P,) reward of one greedy completion per prompt (ReMax's baseline);
- ``reward_components``: (P, G, K) the reward's components, K = len(``REWARD_COMPONENTS``) in that order (GDPO's
  per-component group normalisation).

A plugin adds an estimator with ``register_advantage(name, fn, description=..., needs=...)``: ``fn(rewards, **inputs)``
gets exactly the inputs ``needs`` declares and returns (P, G) advantages; an objective then names it in its
``advantage_estimator`` field, in every engine that can provide what it needs (docs/PLUGINS.md).

verl's per-token optimal baselines (``TOKEN_ESTIMATORS``, ``token_baseline_advantages``) are the exception: one
advantage per token, from π_old's per-token statistics (log π_old and Σ_v π_old² at every token), which exist only
once the rollout is scored. An objective selects them by ``advantage_estimator`` like the others; its
``advantages_from_token_stats`` computes them after the engine's scoring pass, and its loss reads
``PolicyBatch.token_advantages`` (docs/objectives.md, "Per-token optimal baselines").
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from evaluators.hints import check_registered_name, did_you_mean

#: estimators worse than ``group`` by construction: the positive controls' (algorithms/__init__.py, ``control_of``)
CONTROL_ESTIMATORS = ("group-reversed", "group-rolled")
ADVANTAGE_ESTIMATORS = ("group", "group-no-std", "group-batch-std", "rloo", "reinforce++", "reinforce++-baseline",
                        "grpo-passk", "opo", "gpg", "remax", "maxrl", "gdpo", *CONTROL_ESTIMATORS)
ESTIMATOR_NEEDS: dict[str, tuple[str, ...]] = {
    "reinforce++": ("lengths",), "reinforce++-baseline": ("lengths",), "opo": ("lengths",),
    "remax": ("greedy_rewards",), "gdpo": ("lengths", "reward_components"),
}
INPUTS = ("lengths", "greedy_rewards", "reward_components")  # what an estimator may declare it needs
#: the components of a completion's reward that an engine hands an estimator declaring ``reward_components``, in this
#: order (docs/objectives.md, "GDPO"): the verifier's outcome (the coin flip under the random-reward control), whether
#: the completion states its final answer in an explicit answer form (``evaluators.verify.has_answer_marker``), and
#: DAPO's overlong penalty (0 unless the objective's ``overlong_shaping`` is on). The scalar reward every other
#: estimator reads is ``correct + overlong``.
REWARD_COMPONENTS = ("correct", "format", "overlong")
#: per-token estimators (verl's optimal token baselines, ``token_baseline_advantages``): the baseline changes from one
#: token of a completion to the next, so their advantages are (P, G, T). An objective that selects one computes them in
#: ``Objective.advantages_from_token_stats`` once π_old has scored the rollout, and reads them from
#: ``PolicyBatch.token_advantages`` (``group_advantages`` refuses them: ``check_selectable``).
TOKEN_ESTIMATORS = ("optimal-token-baseline", "tir-optimal-token-baseline")
#: what they read beyond the rewards, per token of the sampling policy: log π_old(y_t) and Σ_v π_old(v)², a
#: full-vocabulary quantity no engine keeps (``sum_pi_squared`` computes it from the logits)
TOKEN_ESTIMATOR_NEEDS = ("old_logprobs", "sum_pi_squared")
#: every per-token statistic an objective may declare in ``Objective.token_advantage_needs`` (what an engine computes
#: once π_old has scored the rollout, and hands ``advantages_from_token_stats`` by these names): π_old's log-probs,
#: Σ_v π_old(v)², π_old's full-vocabulary entropies, and the sampled token ids (GTPO's conflict tokens)
TOKEN_STATS = ("old_logprobs", "sum_pi_squared", "old_entropy", "token_ids")
TOKEN_BASELINE_EPS = 1e-8  # verl's epsilon in the baseline's denominator


@dataclass(frozen=True)
class AdvantageSpec:
    """An advantage estimator a plugin registered: ``fn(rewards, **inputs) -> advantages`` of the same (P, G) shape;
    ``module``: where it was registered (what worker processes import to know the name, bench/plugins.py)."""

    name: str
    fn: Callable[..., torch.Tensor]
    description: str
    needs: tuple[str, ...] = ()
    module: str = ""


_REGISTERED: dict[str, AdvantageSpec] = {}


def register_advantage(name: str, fn: Callable[..., torch.Tensor], *, description: str,
                       needs: tuple[str, ...] = (), module: str | None = None) -> AdvantageSpec:
    """Register an advantage estimator ``name`` (a plugin's); objectives select it by ``advantage_estimator``."""
    if module is None:
        module = sys._getframe(1).f_globals.get("__name__", "")
    check_registered_name(name, "advantage estimator")
    if name in ADVANTAGE_ESTIMATORS or name in TOKEN_ESTIMATORS or name in _REGISTERED:
        raise ValueError(f"advantage estimator {name!r} is already registered")
    if not callable(fn):
        raise ValueError(f"advantage estimator {name!r}: fn must be callable, got {type(fn).__name__}")
    bad = [n for n in needs if n not in INPUTS]
    if bad:
        raise ValueError(f"advantage estimator {name!r} needs {bad[0]!r}, which no engine provides; valid: "
                         f"{', '.join(INPUTS)}")
    spec = AdvantageSpec(name, fn, description, tuple(needs), module)
    _REGISTERED[name] = spec
    return spec


def unregister_advantage(name: str) -> None:
    """Remove a registered (plugin) estimator; built-in ones cannot be removed."""
    if name not in _REGISTERED:
        raise ValueError(f"advantage estimator {name!r} is not a registered plugin estimator")
    del _REGISTERED[name]


def estimator_names() -> tuple[str, ...]:
    """Every valid ``advantage_estimator``: the built-in ones (per-token ones included), then those plugins
    registered."""
    return (*ADVANTAGE_ESTIMATORS, *TOKEN_ESTIMATORS, *_REGISTERED)


def check_selectable(name: str) -> None:
    """Refuse (ValueError, one line) a per-token estimator where one advantage per completion is computed from the
    rewards alone (``group_advantages``): it needs log π_old and Σπ_old² at every token, after the scoring pass."""
    if name in TOKEN_ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} gives one advantage per TOKEN (a baseline for every position "
                         "of a completion) from log π_old and Σ_v π_old² at every token, not one per completion from "
                         "the rewards: Objective.advantages_from_token_stats computes it once the rollout is scored "
                         "(algorithms.token_baseline_advantages; docs/objectives.md)")


def registered_advantage(name: str) -> AdvantageSpec | None:
    """The spec of a plugin's estimator ``name``; None for a built-in or unknown name."""
    return _REGISTERED.get(name)


def estimator_needs(name: str) -> tuple[str, ...]:
    """What estimator ``name`` needs beyond the rewards (``ESTIMATOR_NEEDS`` or the plugin's declaration)."""
    spec = _REGISTERED.get(name)
    return spec.needs if spec is not None else ESTIMATOR_NEEDS.get(name, ())


STD_EPS = 1e-6
WHITEN_EPS = 1e-8  # verl's masked_whiten


def _group_std(rewards: torch.Tensor) -> torch.Tensor:
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards[:, :1])
    return rewards.std(dim=1, keepdim=True)


def _token_whiten(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Whiten per-completion values as if repeated over their tokens (verl's masked_whiten on outcome returns):
    mean and Bessel-corrected variance weighted by |y_i|, Â = (v − μ) / sqrt(var + 1e-8)."""
    w = lengths.to(values.dtype)
    n = w.sum().clamp(min=1.0)
    mean = (w * values).sum() / n
    var = (w * (values - mean) ** 2).sum() / n
    var = var * n / (n - 1).clamp(min=1.0)
    return (values - mean) * torch.rsqrt(var + WHITEN_EPS)


def _verl_group_z(scores: torch.Tensor) -> torch.Tensor:
    """(P, G) -> (P, G): verl's GRPO score per group, (r − mean_g r)/(std_g r + 1e-6), std with Bessel's correction;
    a group of ONE gets r/(1 + 1e-6) (verl's mean 0, std 1 for it), not 0."""
    if scores.shape[1] < 2:
        return scores / (1.0 + STD_EPS)
    return (scores - scores.mean(dim=1, keepdim=True)) / (scores.std(dim=1, keepdim=True) + STD_EPS)


def gdpo_advantages(components: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """GDPO (Group reward-Decoupled normalization Policy Optimization, arXiv 2601.05242; verl 0.9.1 ``gdpo``):
    (P, G, K) reward components, (P, G) completion lengths, (K,) weights -> (P, G) advantages.

    Each component k is normalised within its group on its own, A_k = (r_k − mean_g r_k)/(std_g r_k + 1e-6) (Bessel
    std; a group of one: r_k/(1 + 1e-6), as verl), the weighted sum S = Σ_k w_k A_k is then whitened over the batch's
    TOKENS (each completion's S counted |y_i| times, Bessel-corrected variance, (S − μ)/sqrt(var + 1e-8): verl's
    ``masked_whiten``). Normalising the weighted sum of the components within the group instead would be GRPO on
    the summed reward, which GDPO's paper shows collapses distinct reward combinations onto one advantage.
    """
    if components.dim() != 3 or components.shape[:2] != lengths.shape or components.shape[2] != weights.numel():
        raise ValueError(f"gdpo: reward components must be (prompts, group_size, {weights.numel()}) and lengths "
                         f"(prompts, group_size), got {tuple(components.shape)} and {tuple(lengths.shape)}")
    P, G, K = components.shape
    total = torch.zeros(P, G, dtype=components.dtype)
    for k in range(K):
        total = total + weights[k].to(components.dtype) * _verl_group_z(components[:, :, k])
    return _token_whiten(total.flatten(), lengths.flatten()).view(P, G)


def group_advantages(rewards: torch.Tensor, estimator: str, *, lengths: torch.Tensor | None = None,
                     greedy_rewards: torch.Tensor | None = None, reward_components: torch.Tensor | None = None,
                     component_weights: tuple[float, ...] | None = None) -> torch.Tensor:
    """Advantages for rewards of shape (P, G): one row per prompt.

    - ``group``: Â_i = (R_i − mean_g R) / (std_g R + 1e-6)  (GRPO, arXiv 2402.03300; std with Bessel's correction,
      as in TRL)
    - ``group-no-std``: Â_i = R_i − mean_g R  (Dr. GRPO, arXiv 2503.20783)
    - ``group-batch-std``: Â_i = (R_i − mean_g R) / (std_batch R + 1e-6)  (TRL ``scale_rewards="batch"``,
      arXiv 2508.08221)
    - ``rloo``: Â_i = R_i − mean_{j≠i} R_j = G/(G−1)·(R_i − mean_g R)  (arXiv 2402.14740)
    - ``reinforce++``: Â_i = whiten_batch(R_i), token-weighted (arXiv 2501.03262; γ = 1, outcome reward)
    - ``reinforce++-baseline``: Â_i = whiten_batch(R_i − mean_g R), token-weighted (arXiv 2501.03262)
    - ``grpo-passk``: only the best completion of a group gets Â = (R_max − R_second) / (std_g R + 1e-6), every
      other completion 0 (arXiv 2503.19595, as verl)
    - ``opo``: Â_i = R_i − Σ_g |y_g| R_g / Σ_g |y_g|  (optimal length-weighted baseline, arXiv 2505.23585)
    - ``gpg``: Â_i = α (R_i − mean_g R), α = N / #{R ≠ 0 in the batch}  (arXiv 2504.02546, as verl, F_norm = 1)
    - ``remax``: Â_i = R_i − R_greedy(prompt)  (arXiv 2310.10505)
    - ``gdpo``: each reward component z-scored within its group, weighted sum (``component_weights``, one per
      ``REWARD_COMPONENTS``; all 1 by default, as verl), whitened over the batch's tokens (``gdpo_advantages``;
      arXiv 2601.05242). Reads ``reward_components``, not ``rewards``
    - ``maxrl``: Â_i = (R_i − mean_g R) / mean_g R, 0 in a group whose mean reward is ≤ 0 (MaxRL, arXiv 2602.02710,
      Algorithm 1 with its control variate; the paper's 1/N is the aggregation's). Derived for binary rewards: a
      group's Σ Â_i ∇log π is N/K times the mean score of its K successes minus the mean score of all N, an unbiased
      gradient of the order-N truncation of log pass@1. A group of one gets its reward (order 1 = REINFORCE), as every
      other estimator here, since centring a single completion on itself leaves no signal
    - ``group-reversed`` (a positive control): −Â_i of ``group``: every update descends the reward
    - ``group-rolled`` (a positive control): completion i gets the ``group`` advantage of completion i+1 of its group
      (cyclically). The G completions of a prompt are sampled independently, so the credit a completion receives says
      nothing about its own answer, except through the group mean, which contains its reward with weight 1/G: the
      expected update points against the reward at 1/(G−1) of GRPO's strength, plus noise
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (prompts, group_size), got {tuple(rewards.shape)}")
    check_selectable(estimator)
    if estimator not in estimator_names():
        raise ValueError(f"unknown advantage estimator {estimator!r}{did_you_mean(estimator, estimator_names())}; "
                         f"valid: {', '.join(estimator_names())}")
    needs = estimator_needs(estimator)
    if "lengths" in needs and (lengths is None or lengths.shape != rewards.shape):
        raise ValueError(f"advantage estimator {estimator!r} needs completion lengths of shape "
                         f"{tuple(rewards.shape)}, got {None if lengths is None else tuple(lengths.shape)}")
    if "greedy_rewards" in needs and (greedy_rewards is None or greedy_rewards.shape != rewards.shape[:1]):
        got = None if greedy_rewards is None else tuple(greedy_rewards.shape)
        raise ValueError(f"advantage estimator {estimator!r} needs one greedy-completion reward per prompt, shape "
                         f"({rewards.shape[0]},), got {got}")
    K = len(REWARD_COMPONENTS)
    if "reward_components" in needs and (reward_components is None
                                         or reward_components.shape != (*rewards.shape, K)):
        got = None if reward_components is None else tuple(reward_components.shape)
        raise ValueError(f"advantage estimator {estimator!r} needs the reward's components "
                         f"({', '.join(REWARD_COMPONENTS)}) of shape {(*rewards.shape, K)}, got {got}")
    P, G = rewards.shape
    if estimator in _REGISTERED:
        return _plugin_advantages(_REGISTERED[estimator], rewards,
                                  {"lengths": lengths, "greedy_rewards": greedy_rewards,
                                   "reward_components": reward_components})
    if estimator == "gdpo":
        weights = torch.tensor((1.0,) * K if component_weights is None else component_weights, dtype=rewards.dtype)
        return gdpo_advantages(reward_components.to(rewards.dtype), lengths, weights)
    mean = rewards.mean(dim=1, keepdim=True)  # (P, 1)
    centred = rewards - mean  # (P, G)
    if estimator == "group-no-std":
        return centred
    if estimator in ("group", "group-reversed", "group-rolled"):
        z = centred / (_group_std(rewards) + STD_EPS)
        if estimator == "group-reversed":
            return -z
        return torch.roll(z, shifts=-1, dims=1) if estimator == "group-rolled" else z
    if estimator == "group-batch-std":
        std = rewards.std() if rewards.numel() > 1 else torch.zeros(())
        return centred / (std + STD_EPS)
    if estimator == "rloo":
        return centred * G / (G - 1) if G > 1 else rewards.clone()
    if estimator == "reinforce++":
        return _token_whiten(rewards.flatten(), lengths.flatten()).view(P, G)
    if estimator == "reinforce++-baseline":
        base = centred if G > 1 else rewards
        return _token_whiten(base.flatten(), lengths.flatten()).view(P, G)
    if estimator == "grpo-passk":
        if G < 2:
            raise ValueError("advantage estimator 'grpo-passk' needs at least 2 completions per prompt")
        top = torch.topk(rewards, 2, dim=1)
        gap = (top.values[:, 0] - top.values[:, 1]) / (_group_std(rewards)[:, 0] + STD_EPS)  # (P,)
        out = torch.zeros_like(rewards)
        out[torch.arange(P), top.indices[:, 0]] = gap
        return out
    if estimator == "opo":
        w = lengths.to(rewards.dtype)
        base = (w * rewards).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp(min=1.0)
        return rewards - base if G > 1 else rewards.clone()
    if estimator == "gpg":
        alpha = rewards.numel() / torch.count_nonzero(rewards).clamp(min=1)
        return alpha * centred if G > 1 else alpha * rewards
    if estimator == "maxrl":
        if G == 1:
            return rewards.clone()
        safe = mean.clamp(min=torch.finfo(rewards.dtype).tiny)
        return torch.where(mean > 0, centred / safe, torch.zeros_like(centred))
    # remax
    return rewards - greedy_rewards[:, None].to(rewards.dtype)


class PluginResultError(ValueError):
    """What a registered function (a plugin's) returned is wrong (a shape, a NaN): found during the work, not before it
    (exit 1, held-out round 15, H11: exit 2, "bad input before work", after a trial had trained); the line names the
    function's file."""


def _where(fn: Callable) -> str:
    """`` (<name> in <file>:<line>)`` of a registered function, where Python knows its code."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    return f" ({getattr(fn, '__name__', code.co_name)} in {code.co_filename}:{code.co_firstlineno})"


def _plugin_advantages(spec: AdvantageSpec, rewards: torch.Tensor, inputs: dict) -> torch.Tensor:
    """A plugin estimator's advantages, checked: the shape of the rewards, finite (a wrong one fails here, in one line
    naming the estimator, not as a broadcast deep in the loss)."""
    out = spec.fn(rewards, **{k: inputs[k] for k in spec.needs})
    if not isinstance(out, torch.Tensor) or out.shape != rewards.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise PluginResultError(f"advantage estimator {spec.name!r}{_where(spec.fn)} returned {got}, expected a "
                                f"tensor of the rewards' shape {tuple(rewards.shape)} (prompts, group_size): fix it")
    if not torch.isfinite(out).all():
        raise PluginResultError(f"advantage estimator {spec.name!r}{_where(spec.fn)} returned a non-finite advantage "
                                "(NaN or inf): fix it")
    return out.to(rewards.dtype)


# ------------------------------------------------------------------------------------------------ per-token baselines
def sum_pi_squared(logits: torch.Tensor) -> torch.Tensor:
    """Σ_v π(v)² over the last (vocabulary) axis of ``logits``, from log-sum-exps: exp(lse(2z) − 2·lse(z))."""
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))


def token_baseline_advantages(estimator: str, token_rewards: torch.Tensor, mask: torch.Tensor,
                              old_logprobs: torch.Tensor, sum_pi_squared: torch.Tensor, *,
                              is_weights: torch.Tensor | None = None, zero_tail: bool = True,
                              eps: float = TOKEN_BASELINE_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token advantages of the optimal token baseline (OTB; Li, Xu, Li et al., "The Optimal Token Baseline:
    Variance Reduction for Long-Horizon LLM-RL", PMLR v306; verl 0.9.1 ``optimal_token_baseline`` and
    ``tir_optimal_token_baseline``). Every tensor is (P, G, T): P groups (prompts) of G completions, T positions;
    returns (advantages, returns-to-go), both (P, G, T), zero on padding, constants (no gradient).

    For completion i of a group and its position t (m = ``mask``, r = ``token_rewards``):

    - return-to-go G_it = Σ_{s≥t} m_is r_is (γ = 1; an outcome reward on the last token gives G_it = R_i);
    - per-token weight w_it = 1 − 2 π_old(y_it) + Σ_v π_old(v)², i.e. ‖e_y − π_old‖², the squared norm of the
      gradient of log π(y_t) w.r.t. the logits (the paper's logit-gradient proxy), times ρ_it² when IS weights ρ are
      given; its running sum W_it = Σ_{s≤t} m_is w_is;
    - baseline B_t = Σ_g m_gt W_gt G_gt / (Σ_g m_gt W_gt + eps), shared by the group at position t; 0 in a group of
      one (Â = G);
    - ``zero_tail``: when one completion is strictly the longest of its group, its baseline is 0 from the length of
      the second longest on (there B_t would be its own return: Â ≈ 0);
    - Â_it = m_it (G_it − B_t).

    ``optimal-token-baseline`` aligns the group by absolute position t. ``tir-optimal-token-baseline`` aligns it by the
    k-th token the mask counts (tool-integrated reasoning: a completion's mask has gaps where tool outputs were
    inserted), and leaves completions with no tokens out of their group. With masks that are a prefix of every row (one
    turn, as every pobench task) the two are equal.
    """
    if estimator not in TOKEN_ESTIMATORS:
        raise ValueError(f"unknown per-token advantage estimator {estimator!r}"
                         f"{did_you_mean(estimator, TOKEN_ESTIMATORS)}; valid: {', '.join(TOKEN_ESTIMATORS)}")
    if token_rewards.dim() != 3:
        raise ValueError(f"token_rewards must have shape (prompts, group_size, tokens), got "
                         f"{tuple(token_rewards.shape)}")
    named = {"mask": mask, "old_logprobs": old_logprobs, "sum_pi_squared": sum_pi_squared, "is_weights": is_weights}
    for key, t in named.items():
        if t is not None and t.shape != token_rewards.shape:
            raise ValueError(f"{key} must have the shape of token_rewards {tuple(token_rewards.shape)}, got "
                             f"{tuple(t.shape)}")
    with torch.no_grad():
        dtype = token_rewards.dtype
        m = mask.to(dtype)
        returns = (token_rewards * m).flip(-1).cumsum(-1).flip(-1)
        w = 1.0 - 2.0 * old_logprobs.to(dtype).exp() + sum_pi_squared.to(dtype)
        if is_weights is not None:
            w = w * is_weights.to(dtype) ** 2
        W = (w * m).cumsum(-1)
        if estimator == "optimal-token-baseline":
            return _token_baseline(returns, W, m, zero_tail, eps, drop_empty=False), returns
        # tir: move each row's counted tokens to its front (stable: in order), baseline there, move back
        order = torch.argsort((m == 0).to(torch.int8), dim=-1, stable=True)
        packed = [x.gather(-1, order) for x in (returns, W, m)]
        adv = torch.zeros_like(returns).scatter(-1, order, _token_baseline(*packed, zero_tail, eps, drop_empty=True))
        return adv, returns


def _token_baseline(returns: torch.Tensor, W: torch.Tensor, m: torch.Tensor, zero_tail: bool, eps: float, *,
                    drop_empty: bool) -> torch.Tensor:
    """m·(G − B) for (P, G, T) returns, cumulative weights and mask, B as ``token_baseline_advantages`` says;
    ``drop_empty``: completions without tokens are not members of their group (its size is counted without them)."""
    G, T = returns.shape[1:]
    lengths = m.sum(-1)  # (P, G)
    members = (lengths > 0).sum(1) if drop_empty else torch.full(lengths.shape[:1], G)  # (P,)
    base = (m * W * returns).sum(1, keepdim=True) / ((m * W).sum(1, keepdim=True) + eps)  # (P, 1, T)
    base = base.expand_as(returns) * (members > 1).to(returns.dtype)[:, None, None]
    if zero_tail and G > 1:
        top = lengths.topk(2, dim=1).values  # (P, 2): the longest and second-longest lengths
        longest = torch.nn.functional.one_hot(lengths.argmax(1), G).bool() & (top[:, :1] > top[:, 1:])  # (P, G)
        tail = torch.arange(T, device=returns.device)[None, :] >= top[:, 1:]  # (P, T)
        base = base.masked_fill(longest[:, :, None] & tail[:, None, :], 0.0)
    return m * (returns - base)
