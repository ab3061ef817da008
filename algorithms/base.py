"""Base classes: the objective config (frozen, validated, documented fields) and the Objective interface.

An objective owns its loss AND its rollout-side hooks (advantages, group filtering, reward shaping); the training loop
calls only these, so two objectives differ in nothing but what is written here and in their own module.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from evaluators.hints import is_metric_key

from .advantages import (
    REWARD_COMPONENTS,
    TOKEN_ESTIMATOR_NEEDS,
    TOKEN_ESTIMATORS,
    estimator_names,
    estimator_needs,
    group_advantages,
    token_baseline_advantages,
)
from .aggregation import AGGREGATIONS, aggregation_weight
from .batch import PolicyBatch
from .correction import BATCH_OPTIONS, ROLLOUT_CORRECTIONS
from .critic import CriticSpec

GDPO_PAPER = "arXiv 2601.05242"


def param(default: Any, doc: str, *, paper: str | None = None, search: tuple | None = None,
          choices: tuple | None = None, switch: bool = False, requires: str | None = None,
          estimator: str | None = None) -> Any:
    """A config field with its documentation.

    ``doc``: one line shown by ``bench list --details`` and docs/objectives.md; ``paper``: where the default comes
    from (arXiv id); ``search``: ``(low, high, log)`` range that ``bench tune`` searches by default; ``choices``: valid
    values;
    ``switch``: a coefficient whose value 0 turns its term off; ``requires``: the switch this field only acts under;
    ``estimator``: the advantage estimator this field belongs to (GDPO's component weights): under any other
    ``advantage_estimator`` it must keep its default (checked) and is left out of the objective's description.
    A search range is left out of an objective's default search space when its switch is off (searching it would add
    a term the objective does not have): ``bench tune --space`` can still add it.
    """
    meta = {"doc": doc, "paper": paper, "search": search, "choices": choices, "switch": switch,
            "requires": requires, "estimator": estimator}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ObjectiveConfig:
    """Fields shared by every objective: aggregation and the rollout-side hooks."""

    aggregation: str = param("seq-mean-token-mean", "How per-token terms are reduced to the loss.",
                             paper="arXiv 2402.03300", choices=AGGREGATIONS)
    advantage_estimator: str = param("group", "Advantage from grouped rewards (algorithms/advantages.py).",
                                     paper="arXiv 2402.03300", choices=estimator_names)
    dynamic_sampling: bool = param(False, "Drop groups whose verifier outcomes (accuracy) are all equal and refill "
                                          "the batch (DAPO).")
    max_sampling_rounds: int = param(3, "Cap on generation rounds per step when dynamic sampling refills the batch.")
    overlong_shaping: bool = param(False, "DAPO's soft overlong punishment added to the reward.")
    overlong_buffer_frac: float = param(0.2, "L_cache as a fraction of L_max (DAPO: 4096 of 20480 tokens).",
                                        paper="arXiv 2503.14476")
    mask_truncated: bool = param(False, "Drop completions that hit L_max (no stop token) from the loss (DAPO; TRL "
                                 "mask_truncated_completions).", paper="arXiv 2503.14476")
    rollout_correction: str = param("none", "Sampler/trainer mismatch correction: IS weight exp(old − sampler) "
                                    "truncated at C or masked outside [1/C, C], per token or sequence.",
                                    paper="arXiv 2512.02556", choices=ROLLOUT_CORRECTIONS)
    rollout_correction_cap: float = param(3.0, "C: cap of the rollout-correction IS weight (TRL's default 3).",
                                          paper="arXiv 2512.02556")
    off_policy_mask_threshold: float = param(0.0, "δ: drop sequences with Â < 0 and mean_t (sampler − lp) > δ "
                                             "(DeepSeek-V3.2 off-policy sequence mask; 0 disables it).",
                                             paper="arXiv 2512.02556", search=(0.05, 2.0, True), switch=True)
    gdpo_weight_correct: float = param(1.0, "GDPO weight of the verifier-outcome component (advantage_estimator=gdpo "
                                       "only; verl gdpo_reward_weights, default all 1).", paper=GDPO_PAPER,
                                       estimator="gdpo")
    gdpo_weight_format: float = param(1.0, "GDPO weight of the answer-format component: 1 when the completion states "
                                      "its answer as `#### x` or \\boxed{x} (advantage_estimator=gdpo only).",
                                      paper=GDPO_PAPER, estimator="gdpo")
    gdpo_weight_overlong: float = param(1.0, "GDPO weight of DAPO's overlong-penalty component, 0 without "
                                        "overlong_shaping (advantage_estimator=gdpo only).", paper=GDPO_PAPER,
                                        estimator="gdpo")

    @property
    def gdpo_weights(self) -> tuple[float, ...]:
        """The GDPO component weights in ``REWARD_COMPONENTS`` order."""
        return tuple(getattr(self, f"gdpo_weight_{c}") for c in REWARD_COMPONENTS)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if callable(choices):  # a set that plugins extend (advantage estimators): read at validation time
                choices = choices()
            if choices is not None and getattr(self, f.name) not in choices:
                raise ValueError(f"{type(self).__name__}.{f.name}={getattr(self, f.name)!r}: "
                                 f"valid values: {', '.join(map(str, choices))}")
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{type(self).__name__}.{f.name}={value!r}: must be finite")
        if self.max_sampling_rounds < 1:
            self._bad("max_sampling_rounds", "must be >= 1")
        if not (0.0 < self.overlong_buffer_frac < 1.0):
            self._bad("overlong_buffer_frac", "must be in (0, 1)")
        if self.rollout_correction_cap <= 1.0:
            self._bad("rollout_correction_cap", "must be > 1")
        if self.off_policy_mask_threshold < 0:
            self._bad("off_policy_mask_threshold", "must be >= 0 (0 disables the mask)")
        if self.off_policy_mask_threshold != 0 and self.advantage_estimator in TOKEN_ESTIMATORS:
            self._bad("off_policy_mask_threshold", "the off-policy sequence mask reads one advantage per completion "
                                                   f"(Â_i < 0), and advantage_estimator={self.advantage_estimator!r} "
                                                   "gives one per token; leave it at 0")
        for f in dataclasses.fields(self):
            est = f.metadata.get("estimator")
            if est is not None and est != self.advantage_estimator and getattr(self, f.name) != f.default:
                self._bad(f.name, f"acts only with advantage_estimator={est!r} (here {self.advantage_estimator!r}); "
                                  f"leave it at {f.default!r}")
        if self.advantage_estimator == "gdpo" and not any(self.gdpo_weights):
            self._bad("gdpo_weight_correct", "every GDPO component weight is 0: no component would give an advantage")

    def _bad(self, name: str, why: str) -> None:
        raise ValueError(f"{type(self).__name__}.{name}={getattr(self, name)!r}: {why}")

    def _check_epsilon(self, *names: str) -> None:
        for name in names:
            if not (0.0 < getattr(self, name) < 1.0):
                self._bad(name, "must be in (0, 1)")

    def _check_nonneg(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) < 0:
                self._bad(name, "must be >= 0")

    def _check_fraction(self, *names: str) -> None:
        for name in names:
            if not (0.0 <= getattr(self, name) <= 1.0):
                self._bad(name, "must be in [0, 1]")

    def search_space(self) -> dict[str, tuple]:
        """Tunable fields of this config and their declared ``(low, high, log)`` ranges, without the fields whose
        term is switched off here (a ``switch`` field at 0, or a field that ``requires`` one at 0)."""
        meta = {f.name: f.metadata for f in dataclasses.fields(self)}

        def active(name: str) -> bool:
            m = meta[name]
            if m.get("switch") and getattr(self, name) == 0:
                return False
            return m.get("requires") is None or active(m["requires"])

        return {n: tuple(m["search"]) for n, m in meta.items() if m.get("search") and active(n)}

    def outside_ranges(self) -> dict[str, tuple]:
        """The active fields (``search_space``) whose value lies outside the range the objective declares for them:
        name -> (value, low, high). A threshold there may keep its term from ever acting (TEPO's KL mask with τ_A
        above every advantage): the command line warns (bench/preflight.py)."""
        return {n: (getattr(self, n), lo, hi) for n, (lo, hi, *_) in self.search_space().items()
                if not lo <= getattr(self, n) <= hi}


#: why an objective that selects tokens across the micro-batch cannot skip a sequence (``zero_advantage_terms``)
SELECTS_ACROSS_BATCH = "selects tokens across the micro-batch (Â = 0 tokens change the selection)"


class Objective:
    """A policy-optimization objective: ``loss(batch) -> (loss, metrics)`` plus rollout-side hooks.

    Subclasses set ``config_class`` and implement ``loss``; the rollout-side hooks (``advantages``, ``keep_groups``,
    ``shape_rewards``, ``loss_weight``) have defaults. Objectives are pure: no logging, no ``.item()``, no global
    random state. An objective with a controller across optimizer steps (TRL's adaptive entropy coefficient) declares
    its state (``initial_state``); its ``loss`` is then a pure function of the batch, the config and ``self.state``,
    which only the training loop replaces (``next_state`` after each optimizer step, the checkpoint's on a resume).
    """

    config_class: ClassVar[type[ObjectiveConfig]] = ObjectiveConfig
    #: False when the loss selects tokens across the whole batch (top-k by covariance or entropy): then a split batch
    #: is not equivalent to the whole one, and the selection is made per micro-batch.
    split_invariant: ClassVar[bool] = True
    #: True when ``loss`` applies ``correction.prepare`` (truncated masking, rollout correction, off-policy mask);
    #: an objective that does not refuses those fields at any value but their "off" one (no silent no-op).
    supports_batch_options: ClassVar[bool] = False
    #: True when the loss couples the completions of a group (TPO's softmax over the group): an engine then hands it
    #: micro-batches of whole groups, contiguous and in group order, with ``PolicyBatch.group_size`` set, and skips no
    #: row; False (every other objective): rows are split freely and nothing more is computed.
    needs_whole_groups: ClassVar[bool] = False

    @property
    def has_clip(self) -> bool:
        """Whether the loss has a clip whose binding its clip fractions (``objective/clip_frac_*``) measure. False for
        a term without one (its fractions are 0 by construction): the distinguishability probe then does not call
        "clip never binds" an inert term."""
        return True

    def __init__(self, config: ObjectiveConfig, name: str = "") -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        if not self.supports_batch_options:
            for key, off in BATCH_OPTIONS.items():
                if getattr(config, key) != off:
                    raise ValueError(f"objective {name or type(self).__name__!r} does not implement {key}; "
                                     f"leave it at {off!r}")
        self.config = config
        self.name = name or type(self).__name__
        if self.token_estimator is not None and (why := self.token_advantage_refusal()):
            raise ValueError(f"objective {self.name!r} cannot use advantage_estimator={self.token_estimator!r} (one "
                             f"advantage per token): {why}")
        #: what the objective carries from one optimizer step to the next (``initial_state``; empty: nothing)
        self.state: dict[str, float] = self.initial_state()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, config={self.config})"

    # --- what the loop must provide
    @property
    def needs_reference(self) -> bool:
        """Whether ``PolicyBatch.ref_logprobs`` / ``ref_entropy`` must be computed (the reference model loaded): from
        :attr:`batch_fields`, the one declaration."""
        return bool(self.batch_fields & {"ref_logprobs", "ref_entropy"})

    @property
    def needs_entropy_grad(self) -> bool:
        """Whether ``PolicyBatch.entropy`` must carry gradient (entropy bonus)."""
        return False

    @property
    def needs_sampler_logprobs(self) -> bool:
        """Whether ``PolicyBatch.sampler_logprobs`` (the rollout engine's log-probs) must be given."""
        return self.config.rollout_correction != "none"

    @property
    def needs_truncated(self) -> bool:
        """Whether ``PolicyBatch.truncated`` must be given."""
        return self.config.mask_truncated

    @property
    def batch_fields(self) -> frozenset[str]:
        """The optional ``PolicyBatch`` fields the loss (and ``state_sums``) reads, beyond ``logprobs``,
        ``old_logprobs``, ``advantages`` and ``mask``: the one declaration an engine reads to know what to compute and
        hand the objective (no engine probes a loss or reads its errors). A subclass adds its own fields to this; the
        contract tests check, for every registered objective, that a batch with exactly these fields is enough and
        that each is needed."""
        fields = set()
        if self.uses_token_advantages:
            fields.add("token_advantages")
        if self.needs_sampler_logprobs:
            fields.add("sampler_logprobs")
        if self.needs_truncated:
            fields.add("truncated")
        return frozenset(fields)

    @property
    def uses_token_advantages(self) -> bool:
        """Whether the loss reads one advantage per token (``PolicyBatch.token_advantages``) instead of one per
        completion (``PolicyBatch.advantages`` broadcast over its tokens): with a per-token estimator selected
        (``token_estimator``), or for an objective whose advantages are per token by construction (PPO's GAE)."""
        return self.token_estimator is not None

    # --- per-token advantage estimators (verl's optimal token baselines, algorithms.advantages.TOKEN_ESTIMATORS)
    @property
    def token_estimator(self) -> str | None:
        """The per-token estimator the config selects (``advantage_estimator`` in ``TOKEN_ESTIMATORS``), else None."""
        est = self.config.advantage_estimator
        return est if est in TOKEN_ESTIMATORS else None

    @property
    def token_advantage_needs(self) -> tuple[str, ...]:
        """What ``advantages_from_token_stats`` needs at every completion token, once π_old has scored the rollout
        (names from ``TOKEN_STATS``): ``old_logprobs`` and ``sum_pi_squared`` (Σ_v π_old(v)²) with a per-token
        estimator, nothing otherwise (then an engine computes nothing more). An objective whose per-token advantages
        are its own (GTPO: ``token_ids`` and ``old_entropy``) declares what it reads; an engine hands exactly these."""
        return TOKEN_ESTIMATOR_NEEDS if self.token_estimator is not None else ()

    def token_advantage_refusal(self) -> str | None:
        """Why this objective's loss cannot train on per-token advantages (one line), or None when it can: then a
        per-token estimator may be selected and the loss reads ``PolicyBatch.token_advantages`` in place of Â_i.
        Checked when the objective is built. The default refuses: a loss must say it reads per-token advantages
        (``PolicyGradient``'s skeleton does, through its policy term)."""
        return "its loss reads one advantage per completion (PolicyBatch.advantages), not PolicyBatch.token_advantages"

    def advantages_from_token_stats(self, rewards: torch.Tensor, mask: torch.Tensor,
                                    old_logprobs: torch.Tensor | None = None,
                                    sum_pi_squared: torch.Tensor | None = None, *, group_size: int,
                                    is_weights: torch.Tensor | None = None, old_entropy: torch.Tensor | None = None,
                                    token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(N,) shaped outcome rewards (N = P·G completions, prompt-major: the G completions of a prompt adjacent),
        their (N, T) mask, the per-token statistics ``token_advantage_needs`` declares (``TOKEN_STATS``: π_old's (N, T)
        log-probs, Σ_v π_old², entropies; the (N, T) sampled token ids, 0 on padding), and optional (N, T) or (N, 1)
        rollout-correction IS weights -> (N, T) per-token advantages, constants, 0 on padding. Here: those of the
        selected per-token estimator (``algorithms.token_baseline_advantages``: each reward on its completion's last
        counted token, the rows grouped (P, G, T))."""
        from .critic import outcome_token_rewards

        est = self.token_estimator
        if est is None:
            raise ValueError(f"objective {self.name!r}: advantage_estimator={self.config.advantage_estimator!r} is not "
                             f"a per-token estimator ({', '.join(TOKEN_ESTIMATORS)})")
        N, T = mask.shape
        if group_size < 1 or N % group_size:
            raise ValueError(f"advantages_from_token_stats: {N} completions do not split into groups of {group_size}")
        if old_logprobs is None or sum_pi_squared is None:
            raise ValueError(f"objective {self.name!r}: {est!r} needs old_logprobs and sum_pi_squared")
        dtype = old_logprobs.dtype if old_logprobs.is_floating_point() else torch.float32
        mask = mask.to(dtype)
        token_rewards = outcome_token_rewards(rewards.to(dtype), mask)
        if is_weights is not None:
            is_weights = is_weights.to(dtype).expand(N, T)

        def grouped(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.reshape(N // group_size, group_size, T)

        adv, _ = token_baseline_advantages(est, grouped(token_rewards), grouped(mask), grouped(old_logprobs.to(dtype)),
                                           grouped(sum_pi_squared.to(dtype)), is_weights=grouped(is_weights))
        return adv.reshape(N, T)

    @property
    def critic(self) -> CriticSpec | None:
        """The learned value function the objective needs (model, optimizer, learning rate, warm-up), which the engine
        builds, trains on ``value_loss`` after computing ``advantages_from_values``, and keeps in every checkpoint;
        None (every objective without a critic): the engine builds nothing and its checkpoints hold nothing more."""
        return None

    def advantages_from_values(self, rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(N,) shaped rewards, (N, T) critic values V(s_t) of the sampled completions and their (N, T) mask ->
        ((N, T) per-token advantages, (N, T) returns the critic is trained towards). An objective with a ``critic``
        implements it."""
        raise NotImplementedError(f"{type(self).__name__} declares no critic: it has no advantages_from_values")

    def value_loss(self, values: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor, mask: torch.Tensor,
                   max_length: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The critic's loss (a scalar carrying the gradient of ``values``, the critic's (B, T) predictions) and its
        ``critic/*`` metrics; ``old_values`` are the critic's values when the rollout was scored. An objective with a
        ``critic`` implements it."""
        raise NotImplementedError(f"{type(self).__name__} declares no critic: it has no value_loss")

    @property
    def separable_kl(self) -> float | None:
        """β when the objective's KL term is exactly β·KL(π_θ‖π_ref) on every completion token with its
        ``kl_estimator`` (an engine may run it as its own KL loss, and the objective with ``kl_coef`` = 0); 0.0 when
        it has no KL term; None when its KL term is another one (a factor such as r·KL, a mask, another target)."""
        return None if getattr(self.config, "kl_coef", 0.0) > 0 else 0.0

    @property
    def advantage_needs(self) -> tuple[str, ...]:
        """What ``advantages`` needs beyond the rewards: ``lengths`` and/or ``greedy_rewards`` (one greedy completion
        per prompt, scored like the sampled ones; the loop generates it only when this says so)."""
        return estimator_needs(self.config.advantage_estimator)

    # --- the loss
    def loss(self, batch: PolicyBatch, generator: torch.Generator | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def checked_loss(self, batch: PolicyBatch, generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`loss`, as every engine calls it: a result that is not (a scalar tensor, a dict of scalar tensors), or
        a method the objective's class left unimplemented, is one ValueError naming the objective (a plugin's
        mistake, met here rather than as a traceback deep in the update)."""
        try:
            out = self.loss(batch, generator=generator)
        except NotImplementedError as e:
            raise ValueError(f"objective {self.name!r} ({type(self).__name__}): {e or 'a method is not implemented'}"
                             ) from None
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor)
                and isinstance(out[1], dict)):
            raise ValueError(f"objective {self.name!r}: loss returned {type(out).__name__}, expected (a scalar "
                             "tensor, a dict of metrics)")
        loss, metrics = out
        if loss.dim() != 0:
            raise ValueError(f"objective {self.name!r}: loss returned a tensor of shape {tuple(loss.shape)}, expected "
                             "a scalar (aggregate the per-token terms: algorithms.aggregate)")
        bad = [k for k, v in metrics.items() if not isinstance(v, torch.Tensor) or v.dim() != 0]
        if bad:
            raise ValueError(f"objective {self.name!r}: metric {bad[0]!r} is not a scalar tensor")
        bad = [k for k in metrics if not is_metric_key(k)]
        if bad:  # (MLflow would refuse it at the step's flush, with its traceback)
            raise ValueError(f"objective {self.name!r}: metric name {bad[0]!r} cannot be an MLflow key (letters, "
                             "digits and _ . / : - or space, at most 250): rename it")
        return loss, metrics

    def loss_weight(self, mask: torch.Tensor, truncated: torch.Tensor | None = None) -> torch.Tensor:
        """Weight of a micro-batch's loss (given its (B, T) completion mask and (B,) truncation flags) when gradients
        are accumulated over several: full loss = Σ_k w_k·loss_k / Σ_k w_k (see ``aggregation.aggregation_weight``).
        With ``mask_truncated`` the truncated completions leave the mask first, as they leave the loss's normaliser."""
        if self.config.mask_truncated and truncated is not None:
            mask = mask * (~truncated.to(torch.bool)).to(mask.dtype)[:, None]
        return aggregation_weight(mask, self.config.aggregation)

    def zero_advantage_terms(self) -> tuple[str, ...]:
        """The terms through which a sequence with Â_i = 0 can carry gradient under this config; empty when none can.

        When empty, the training loop skips such sequences' forward and backward (``skips_zero_advantage``) while
        their weight stays in every normaliser, so the gradient equals the full computation (tested for every
        registered objective). This default names a reason: an objective that does not declare it is never skipped.
        """
        if not self.split_invariant:
            return (SELECTS_ACROSS_BATCH,)
        return ("the objective does not declare that its loss vanishes at Â = 0",)

    @property
    def skips_zero_advantage(self) -> bool:
        """Whether sequences with Â_i = 0 provably carry no gradient (``zero_advantage_terms`` is empty)."""
        return not self.zero_advantage_terms()

    # --- state across optimizer steps: a controller (none by default). The training loop adds up ``state_sums`` over
    # the micro-batches of each optimizer step, then sets ``state = next_state(state, sums)``; it saves ``state`` in
    # every checkpoint and restores it on a resume (``restore_state``), and logs ``state_metrics()`` each step.
    def initial_state(self) -> dict[str, float]:
        """The state at the start of a run (JSON numbers, so a checkpoint holds it exactly); empty: the objective is
        a pure function of its batch and config, and the loop has nothing to carry."""
        return {}

    def state_sums(self, batch: PolicyBatch) -> dict[str, torch.Tensor]:
        """What ``next_state`` reads of one micro-batch: 0-d sums, added up over the optimizer step's micro-batches
        (so the step's value does not depend on how it was split)."""
        return {}

    def next_state(self, state: dict[str, float], sums: dict[str, float]) -> dict[str, float]:
        """The state after an optimizer step, from the state before it and the step's added-up ``state_sums``."""
        return state

    def state_metrics(self) -> dict[str, float]:
        """Metrics of the current state, logged after each training step (``objective/*`` names)."""
        return {}

    def probe_state(self) -> dict[str, float] | None:
        """The state the distinguishability probe evaluates a stateful objective at: one where what the state
        controls acts (its initial state may switch it off, so the objective would look like one without it); None:
        the initial state."""
        return None

    def restore_state(self, saved: dict[str, Any] | None) -> None:
        """Set the state a checkpoint saved; ValueError when it is not this objective's (other fields, not numbers)."""
        want = self.initial_state()
        saved = {} if saved is None else saved
        if (not isinstance(saved, dict) or set(saved) != set(want)
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in saved.values())):
            raise ValueError(f"objective {self.name!r}: the saved state {saved!r} is not this objective's (fields "
                             f"{sorted(want) or 'none'})")
        self.state = {k: float(saved[k]) for k in want}

    # --- rollout-side hooks
    def advantages(self, rewards: torch.Tensor, *, lengths: torch.Tensor | None = None,
                   greedy_rewards: torch.Tensor | None = None,
                   reward_components: torch.Tensor | None = None) -> torch.Tensor:
        """(P, G) rewards -> (P, G) advantages (``lengths`` (P, G), ``greedy_rewards`` (P,) and
        ``reward_components`` (P, G, K) when the estimator declares it needs them: ``advantage_needs``). With a
        per-token estimator: the rewards themselves (its advantages are ``advantages_from_token_stats``', once π_old
        has scored the completions)."""
        if self.token_estimator is not None:
            return rewards.clone()
        return group_advantages(rewards, self.config.advantage_estimator, lengths=lengths,
                                greedy_rewards=greedy_rewards, reward_components=reward_components,
                                component_weights=self.config.gdpo_weights)

    def keep_groups(self, rewards: torch.Tensor, outcomes: torch.Tensor) -> torch.Tensor:
        """(P, G) shaped rewards and (P, G) verifier outcomes -> (P,) bool: which groups enter the batch.

        Dynamic sampling drops the groups whose OUTCOMES (accuracy) are all equal, as DAPO's recipe does
        (``filter_groups.metric=acc``): reward shaping alone (overlong punishment) does not keep a group whose answers
        are all right or all wrong. ``outcomes`` is what the loop scored before shaping: the verifier's 1/0, or the
        coin flip that replaces it under the random-reward control.
        """
        if not self.config.dynamic_sampling:
            return torch.ones(rewards.shape[0], dtype=torch.bool)
        return (outcomes.max(dim=1).values - outcomes.min(dim=1).values) > 0

    def shape_rewards(self, rewards: torch.Tensor, lengths: torch.Tensor, max_length: int) -> torch.Tensor:
        """(N,) rewards and completion lengths -> shaped rewards (DAPO overlong punishment when enabled).

        penalty = 0 for L <= L_max − L_cache; (L_max − L_cache − L) / L_cache for L_max − L_cache < L <= L_max;
        −1 beyond (arXiv 2503.14476, eq. 13).
        """
        if not self.config.overlong_shaping:
            return rewards
        cache = max(1.0, self.config.overlong_buffer_frac * max_length)
        expected = max_length - cache
        lengths = lengths.to(rewards.dtype)
        penalty = torch.clamp((expected - lengths) / cache, min=-1.0, max=0.0)  # (N,)
        return rewards + penalty
