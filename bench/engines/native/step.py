"""One training step of the native loop (loop.py), in its order: ``collect_rollouts`` (sample, verify, the
objective's shaping / filtering / refill, advantages) then ``update`` (π_old / π_ref scoring when needed, μ epochs x
minibatches of gradient-accumulated optimizer steps, each followed by the objective's ``next_state``: a controller's
update, a no-op for the objectives without state). ``Group`` is what passes between them. Objectives differ only in
`algorithms/`: nothing here branches on an objective's name.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from algorithms import PolicyBatch, batch_for, has_advantage
from algorithms.advantages import REWARD_COMPONENTS
from algorithms.correction import is_weights
from bench.config import TrainConfig
from bench.data import TrainData, derive_seed
from bench.engines.base import TrainingDiverged
from bench.engines.native.batching import (
    group_size_of,
    length_grouped,
    whole_group_micro_batches,
    whole_group_minibatches,
)
from bench.engines.native.critic import Critic, score_values, update_critic
from bench.engines.step_stats import UpdateStats, entropy_summary, rollout_summary
from bench.model import format_prompt
from bench.rollout import Sampler, SamplingParams
from bench.rollout.prefix import score_shared
from bench.rollout.scoring import score
from evaluators.tasks import checked_reward
from evaluators.verify import has_answer_marker
from reports import metric_keys as K


def pad(rows: list[torch.Tensor], T: int) -> torch.Tensor:
    out = torch.zeros(len(rows), T)  # (B, T)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


@dataclass
class Group:
    """The G completions of one prompt that enter the update."""

    question: str
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    texts: list[str]
    rewards: torch.Tensor  # (G,) shaped rewards the objective trains on
    correct: torch.Tensor  # (G,) verifier outcome
    advantages: torch.Tensor | None = None  # (G,)
    logprobs: list[list[float]] = field(default_factory=list)  # per completion: the sampler's log-probs
    entropies: list[list[float]] = field(default_factory=list)  # ... and entropies, as the sampler returned them
    problem: Any = None  # the task's problem (scores the greedy baseline completion when the estimator needs one)
    truncated: torch.Tensor | None = None  # (G,) bool: finished by length, not by a stop token
    outcomes: torch.Tensor | None = None  # (G,) the reward before shaping: the verifier's, or the random-reward coin


def collect_rollouts(cfg: TrainConfig, objective, sampler: Sampler, tok, data: TrainData, step: int
                     ) -> tuple[list[Group], dict[str, float]]:
    """Sample, score with the verifier, shape / filter / refill, compute advantages. Returns groups and metrics."""
    P, G = cfg.prompts_per_step, cfg.group_size
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
    rounds = objective.config.max_sampling_rounds if objective.config.dynamic_sampling else 1
    kept: list[Group] = []
    all_correct, entropies, zero_adv = [], [], 0
    n_groups = gen_tokens = 0
    gen_s = 0.0
    for r in range(rounds):
        problems = data.batch(step, r)
        prompts = [format_prompt(tok, p.question, cfg.prompt_template) for p in problems]
        t0 = time.perf_counter()
        try:
            ro = sampler.generate(prompts, G, params, seed=derive_seed(cfg.seed, "rollout", step, r))
        except RuntimeError as e:  # torch.multinomial refuses NaN/inf probabilities: the weights blew up
            if any(w in str(e).lower() for w in ("nan", "inf")):
                raise TrainingDiverged(f"step {step}: sampling failed because the policy's probabilities are "
                                       f"non-finite ({e}); the learning rate may be too high") from e
            raise
        gen_s += time.perf_counter() - t0
        correct = torch.tensor([checked_reward(data.task, ro.texts[i], problems[i // G]) for i in range(len(ro))])
        rewards = correct.clone()
        if cfg.control == "random-reward":  # a coin flip with the same mean: gains must then vanish
            g = torch.Generator().manual_seed(derive_seed(cfg.seed, "random-reward", step, r))
            rewards = torch.bernoulli(torch.full_like(rewards, float(rewards.mean())), generator=g)
        length = torch.tensor([len(c) for c in ro.completion_ids])
        shaped = objective.shape_rewards(rewards, length, cfg.max_new_tokens).view(len(problems), G)  # (P, G)
        keep = objective.keep_groups(shaped, outcomes=rewards.view(len(problems), G))  # (P,): filter on accuracy
        all_correct.append(correct)
        entropies.extend(torch.tensor(e) for e in ro.entropies if e)
        by_length = torch.tensor([f == "length" for f in ro.finish_reasons])  # (P·G,)
        zero_adv += int(((shaped.max(1).values - shaped.min(1).values) == 0).sum())
        n_groups += len(problems)
        gen_tokens += int(length.sum())
        if r == 0:  # the step's own prompts, sampled alike by every objective: the like-for-like metrics below
            round_0 = rollout_summary(shaped, correct, length, by_length)
            ent_0, zero_adv_0 = len(entropies), zero_adv
        for p in range(len(problems)):
            if keep[p] and len(kept) < P:
                kept.append(Group(problems[p].question, ro.prompt_ids[p], ro.completion_ids[p * G:(p + 1) * G],
                                  ro.texts[p * G:(p + 1) * G], shaped[p], correct[p * G:(p + 1) * G],
                                  logprobs=ro.logprobs[p * G:(p + 1) * G], entropies=ro.entropies[p * G:(p + 1) * G],
                                  problem=problems[p], truncated=by_length[p * G:(p + 1) * G],
                                  outcomes=rewards[p * G:(p + 1) * G]))
        if len(kept) >= P:
            break
    extra: dict[str, torch.Tensor] = {}
    if kept:
        extra = advantage_inputs(cfg, objective, sampler, tok, data, kept, step)
        adv = objective.advantages(torch.stack([g.rewards for g in kept]), **extra)  # (K, G)
        for g, a in zip(kept, adv):
            g.advantages = a
    # rollout/* describe round 0 only, so every objective's curves measure the same thing; what dynamic sampling's
    # refill rounds add has its own rollout/refill_* metrics (docs/METRICS.md)
    refill_correct = torch.cat(all_correct[1:]) if len(all_correct) > 1 else torch.zeros(0)
    metrics = {**round_0, **entropy_summary(torch.cat(entropies[:ent_0]) if ent_0 else torch.zeros(0)),
               K.TOKENS_PER_S: gen_tokens / max(gen_s, 1e-9), K.GEN_TOKENS: float(gen_tokens),
               K.SAMPLING_ROUNDS: float(r + 1), K.KEPT_GROUPS: float(len(kept))}
    if rounds > 1:  # objectives with dynamic sampling
        metrics[K.REFILL_COMPLETIONS] = float(refill_correct.numel())
        metrics[K.REFILL_ACCURACY] = float(refill_correct.mean()) if refill_correct.numel() else float("nan")
        metrics[K.REFILL_ZERO_ADV_FRAC] = (zero_adv - zero_adv_0) / max(1, n_groups - P)
    if "greedy_rewards" in extra:
        metrics[K.GREEDY_REWARD_MEAN] = float(extra["greedy_rewards"].mean())
    return kept, metrics


def advantage_inputs(cfg: TrainConfig, objective, sampler: Sampler, tok, data: TrainData, groups: list[Group],
                     step: int
                     ) -> dict[str, torch.Tensor]:
    """What the objective's advantage estimator declares it needs beyond the rewards (``advantage_needs``):
    completion lengths, the shaped reward of one greedy completion per prompt (ReMax), generated only then, and/or the
    reward's components (GDPO: ``REWARD_COMPONENTS``, (K, G, 3)): the outcome, the answer format and the overlong
    penalty (shaped − outcome). Under the random-reward control the format component is a coin flip of its own mean,
    as the outcome is: no component then carries information about the completion but its length."""
    needs = objective.advantage_needs
    out: dict[str, torch.Tensor] = {}
    if "lengths" in needs:
        out["lengths"] = torch.tensor([[len(c) for c in g.completion_ids] for g in groups])
    if "greedy_rewards" in needs:
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=0.0)
        prompts = [format_prompt(tok, g.question, cfg.prompt_template) for g in groups]
        ro = sampler.generate(prompts, 1, params, seed=derive_seed(cfg.seed, "greedy-baseline", step))
        correct = torch.tensor([checked_reward(data.task, ro.texts[i], g.problem) for i, g in enumerate(groups)])
        length = torch.tensor([len(c) for c in ro.completion_ids])
        out["greedy_rewards"] = objective.shape_rewards(correct, length, cfg.max_new_tokens)
    if "reward_components" in needs:
        outcome = torch.stack([g.outcomes for g in groups])  # (K, G)
        fmt = torch.tensor([[float(has_answer_marker(t)) for t in g.texts] for g in groups])  # (K, G)
        if cfg.control == "random-reward":
            gen = torch.Generator().manual_seed(derive_seed(cfg.seed, "random-format", step))
            fmt = torch.bernoulli(torch.full_like(fmt, float(fmt.mean())), generator=gen)
        overlong = torch.stack([g.rewards for g in groups]) - outcome  # (K, G): 0 without overlong_shaping
        parts = {"correct": outcome, "format": fmt, "overlong": overlong}
        out["reward_components"] = torch.stack([parts[c] for c in REWARD_COMPONENTS], dim=-1)  # (K, G, 3)
    return out


def update(cfg: TrainConfig, objective, model, ref_model, optimizer, sampler: Sampler, groups: list[Group],
           step: int, critic: Critic | None = None) -> dict[str, float]:
    """μ epochs over `cfg.minibatches` minibatches, each gradient-accumulated over micro-batches.

    Two exact savings (docs/SCALE.md): with ``cfg.shared_prefix`` every pass forwards each prompt once per micro-batch
    (bench/rollout/prefix.py); with ``cfg.skip_zero_advantage`` and an objective whose zero-advantage sequences carry
    no gradient (``Objective.skips_zero_advantage``) those sequences get no forward / backward with gradient: their
    loss weight stays in the minibatch's total, so the gradient is the full computation's, and they enter the metrics
    through a pass without gradient (none before a rollout's first optimizer step, when the sampling policy's
    log-probs, the rollout's or the scoring pass's, are the current policy's).

    With a ``critic`` (an objective that declares one: PPO) the critic scores the rollouts first, the objective turns
    its values and the rewards into per-token advantages and returns (``advantages_from_values``), the critic trains
    on them (bench/engines/native/critic.py), and the policy update reads the per-token advantages; during the
    critic's warm-up steps the policy is not updated.

    With a per-token advantage estimator (``Objective.token_advantage_needs``: verl's optimal token baselines) one
    scoring pass of the sampling policy gives log π_old, H_old and Σ_v π_old² at every token (on-policy too: the
    rollout records no Σπ²); the objective turns them, the rewards and the rollout-correction IS weights (if any) into
    per-token advantages (``advantages_from_token_stats``), which the policy update reads, and the same pass is the
    update's π_old. An objective whose per-token advantages are its own (GTPO) declares what the hook reads the same way
    (π_old's entropies, the sampled token ids: no Σπ² then). Objectives without either run no such pass."""
    if not groups:  # dynamic sampling found no informative group in its rounds: nothing to learn from
        return {K.SKIPPED: 1.0, K.SCORING_S: 0.0}
    prompts = [g.prompt_ids for g in groups for _ in g.completion_ids]
    completions = [c for g in groups for c in g.completion_ids]
    adv = torch.cat([g.advantages for g in groups]).float()  # (N,)
    has_sampler_lp = all(len(g.logprobs) == len(g.completion_ids) for g in groups)
    samp_lp = [lp for g in groups for lp in g.logprobs] if has_sampler_lp else None  # (rollout correction)
    exact_sampler_lp = has_sampler_lp and sampler.exact_logprobs
    truncated = torch.cat([g.truncated if g.truncated is not None else torch.zeros(len(g.completion_ids), dtype=bool)
                           for g in groups])  # (N,)
    N = len(completions)
    on_policy = cfg.update_epochs == 1 and cfg.minibatches == 1
    temp = cfg.temperature
    mb = cfg.micro_batch_size
    device = next(model.parameters()).device
    c_len, p_len = [len(c) for c in completions], [len(p) for p in prompts]
    scorer = score_shared if cfg.shared_prefix else score  # the same numbers (bench/rollout/prefix.py)
    whole = objective.needs_whole_groups  # (TPO) micro-batches of whole groups, contiguous, in group order; no skip
    G = group_size_of(groups) if whole else None
    skip = cfg.skip_zero_advantage and objective.skips_zero_advantage and not whole
    params = [p for p in model.parameters() if p.requires_grad]

    # --- the critic (PPO): values of the sampling policy's completions -> per-token advantages and returns -> the
    # critic's update; the per-completion advantage is then the token mean of Â_it (samples, zero-advantage count)
    tok_adv: torch.Tensor | None = None
    critic_metrics: dict[str, float] = {}
    t0 = time.perf_counter()
    if critic is not None:
        T_all = max(1, max(c_len))
        full_mask = pad([torch.ones(n) for n in c_len], T_all)  # (N, T)
        old_values = pad(score_values(critic, prompts, completions, mb), T_all)  # (N, T)
        rewards = torch.cat([g.rewards for g in groups]).float()
        tok_adv, returns = objective.advantages_from_values(rewards, old_values, full_mask)
        adv = (tok_adv * full_mask).sum(-1) / full_mask.sum(-1).clamp(min=1.0)
        start = 0
        for g in groups:
            g.advantages = adv[start:start + len(g.completion_ids)]
            start += len(g.completion_ids)
        critic_metrics = update_critic(cfg, objective, critic, prompts, completions, old_values, returns, full_mask,
                                       step)
        critic_metrics["critic/warmup"] = float(step <= critic.spec.warmup_steps)
        if step <= critic.spec.warmup_steps:  # the critic's warm-up: the policy waits
            return {**critic_metrics, K.SCORING_S: time.perf_counter() - t0}

    # --- the sampling policy (when off-policy updates follow): the rollout's own log-probs and entropies when the
    # sampler's are exact for the training module (HF sampler), otherwise one scoring pass without gradient; with a
    # per-token advantage estimator that pass always runs, with Σπ², and gives the per-token advantages; reference
    t0 = time.perf_counter()
    old_lp = old_ent = ref_lp = ref_ent = None
    if needs := objective.token_advantage_needs:
        with_s2 = "sum_pi_squared" in needs
        old_lp, old_ent, *old_s2 = _score_rows(model, prompts, completions, temp, mb, cfg.scoring_chunk_mb, scorer,
                                               sum_pi_squared=with_s2)
        tok_adv, full_mask = _token_advantages(cfg, objective, groups, old_lp, old_ent, old_s2[0] if with_s2 else None,
                                               samp_lp)
        adv = (tok_adv * full_mask).sum(-1) / full_mask.sum(-1).clamp(min=1.0)  # (metrics, samples)
        start = 0
        for g in groups:
            g.advantages = adv[start:start + len(g.completion_ids)]
            start += len(g.completion_ids)
    elif exact_sampler_lp and (not on_policy or skip):  # (on-policy they stand in for skipped rows in the metrics)
        old_lp = [torch.tensor(x) for g in groups for x in g.logprobs]
        old_ent = [torch.tensor(x) for g in groups for x in g.entropies]
    elif not on_policy:
        old_lp, old_ent = _score_rows(model, prompts, completions, temp, mb, cfg.scoring_chunk_mb, scorer)
    if ref_model is not None:
        with ref_model.policy() as ref:
            ref_lp, ref_ent = _score_rows(ref, prompts, completions, temp, mb, cfg.scoring_chunk_mb, scorer)
    scoring_s = time.perf_counter() - t0
    live_rows = has_advantage(adv, tok_adv, full_mask if tok_adv is not None else None)  # (N,): what a skip keeps

    stats = UpdateStats()  # weighted objective metrics, train/loss, KL to π_ref, how far the policy moved from π_old

    def micro_batch(ids: list[int], lp, ent, mask, with_grad: bool) -> PolicyBatch:
        T = lp.shape[1]
        return batch_for(
            objective, "native loop", logprobs=lp, mask=mask, advantages=adv[ids].to(device),
            max_length=cfg.max_new_tokens,
            old_logprobs=lp.detach() if on_policy else pad([old_lp[i] for i in ids], T).to(device),
            old_entropy=ent.detach() if on_policy else pad([old_ent[i] for i in ids], T).to(device),
            ref_logprobs=None if ref_lp is None else pad([ref_lp[i] for i in ids], T).to(device),
            ref_entropy=None if ref_ent is None else pad([ref_ent[i] for i in ids], T).to(device),
            entropy=ent if with_grad else ent.detach(),
            sampler_logprobs=None if samp_lp is None else pad([torch.tensor(samp_lp[i]) for i in ids], T).to(device),
            truncated=truncated[ids].to(device), group_size=G,
            token_advantages=None if tok_adv is None else tok_adv[ids, :T].to(device))

    for epoch in range(cfg.update_epochs):
        order = torch.randperm(N, generator=torch.Generator().manual_seed(derive_seed(cfg.seed, "perm", step, epoch)))
        minibatches = (whole_group_minibatches(order, N, G, cfg.minibatches) if whole
                       else torch.tensor_split(order, min(cfg.minibatches, N)))
        for j, minibatch in enumerate(minibatches):  # (dynamic sampling may keep < M rows)
            # before the first optimizer step the policy is the sampling policy: on-policy in fact
            sampling_policy = on_policy or (epoch == 0 and j == 0)
            live = minibatch[live_rows[minibatch]] if skip else minibatch  # (skipped: Â = 0, no gradient)
            dead = minibatch[~live_rows[minibatch]] if skip else minibatch[:0]
            grouped = cfg.length_grouped_micro_batches and objective.split_invariant and not whole
            if whole:  # whole groups: max(1, ⌊mb / G⌋) groups per micro-batch (batching.py)
                micro = whole_group_micro_batches(live, G, mb)
            else:
                micro = (length_grouped(live, c_len, p_len, mb)  # less padding, same gradient (batching.py)
                         if grouped else torch.split(live, mb)) if len(live) else ()
            skipped = length_grouped(dead, c_len, p_len, mb) if len(dead) else ()
            parts = [*micro, *skipped]
            masks = [pad([torch.ones(c_len[i]) for i in idx.tolist()], max(c_len[i] for i in idx.tolist()))
                     for idx in parts]
            # each part's loss weight, skipped rows included: the minibatch's normaliser is the full computation's
            w_loss = [float(objective.loss_weight(m, truncated[idx])) for idx, m in zip(parts, masks)]
            w_total = sum(w_loss)
            optimizer.zero_grad(set_to_none=True)
            state_sums: dict[str, float] = {}  # the objective's controller input, over the optimizer step
            for k, idx in enumerate(parts):
                ids, live_part = idx.tolist(), k < len(micro)
                if live_part or not (sampling_policy and old_lp is not None):
                    lp, ent, mask = scorer(model, [prompts[i] for i in ids], [completions[i] for i in ids], temp,
                                           grad=live_part, chunk_mb=cfg.scoring_chunk_mb)
                else:  # a skipped part before any optimizer step: the sampling policy's log-probs and entropies
                    # (the rollout's, or the scoring pass's) are the current policy's
                    mask = masks[k].to(device)
                    lp = pad([old_lp[i] for i in ids], mask.shape[1]).to(device)
                    ent = pad([old_ent[i] for i in ids], mask.shape[1]).to(device)
                batch = micro_batch(ids, lp, ent, mask, with_grad=live_part)
                gen = torch.Generator().manual_seed(derive_seed(cfg.seed, "objective", step, epoch, k))
                with torch.set_grad_enabled(live_part):
                    loss, m = objective.checked_loss(batch, generator=gen)
                if not torch.isfinite(loss):
                    bad = [f"{key}={float(v.detach())}" for key, v in m.items() if not torch.isfinite(v)]
                    raise TrainingDiverged(f"step {step}: the loss is {float(loss.detach())} (non-finite metrics: "
                                           f"{', '.join(bad) or 'none; check the log-probs'})")
                if live_part:
                    (loss * (w_loss[k] / w_total if w_total > 0 else 0.0)).backward()
                # metrics are weighted as before: by the micro-batch's weight without the truncation mask
                stats.add(batch, loss, m, float(objective.loss_weight(mask)))
                for key, v in objective.state_sums(batch).items():
                    state_sums[key] = state_sums.get(key, 0.0) + float(v)
            if not micro:  # every row skipped: the full computation's gradient is exactly 0, and AdamW steps on it
                for p in params:
                    p.grad = torch.zeros_like(p)
            limit = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
            norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
            if not math.isfinite(norm):
                raise TrainingDiverged(f"step {step}: the gradient norm is {norm} (train/grad_norm)")
            stats.add_grad_norm(norm)
            optimizer.step()
            objective.state = objective.next_state(objective.state, state_sums)  # (stateless: unchanged)
            sampler.update_weights(model)
    return {**stats.summary(), **critic_metrics, K.SCORING_S: scoring_s}


def _score_rows(model, prompts, completions, temperature, mb, chunk_mb: float = 256.0, scorer=score,
                sum_pi_squared: bool = False) -> tuple[list[torch.Tensor], ...]:
    """Per-completion 1-D log-prob and entropy tensors (no gradient), and with ``sum_pi_squared`` Σ_v π(v)² ones,
    scored in micro-batches of similar lengths (less padding; batching.py) by `scorer` (``score`` or
    ``score_shared``), returned in the input order."""
    n = len(completions)
    order = sorted(range(n), key=lambda i: (len(completions[i]), len(prompts[i])))
    out: list[list[torch.Tensor]] = [[torch.zeros(0)] * n for _ in range(3 if sum_pi_squared else 2)]
    for s in range(0, n, mb):
        rows = order[s:s + mb]
        lp, ent, _, *s2 = scorer(model, [prompts[i] for i in rows], [completions[i] for i in rows], temperature,
                                 grad=False, chunk_mb=chunk_mb, **({"sum_pi_squared": True} if sum_pi_squared else {}))
        for j, i in enumerate(rows):
            for k, x in enumerate((lp, ent, *s2)):
                out[k][i] = x[j, : len(completions[i])].cpu()
    return tuple(out)


def _token_advantages(cfg: TrainConfig, objective, groups: list[Group], old_lp: list[torch.Tensor],
                      old_ent: list[torch.Tensor], old_s2: list[torch.Tensor] | None, samp_lp: list | None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """((N, T) per-token advantages, (N, T) mask) of the objective's ``advantages_from_token_stats`` over whole groups:
    the groups' shaped rewards, what its ``token_advantage_needs`` names of π_old's log-probs, entropies and Σπ² from
    the scoring pass and of the sampled token ids, and the objective's rollout-correction IS weights
    exp(old − sampler) (truncated / masked as its ``rollout_correction`` says) when it has one, over every completion
    token."""
    c_len = [len(x) for x in old_lp]
    T = max(1, max(c_len))
    mask = pad([torch.ones(n) for n in c_len], T)  # (N, T)
    old = pad(old_lp, T)
    rho = None
    c = objective.config
    if c.rollout_correction != "none" and samp_lp is not None:
        sampler = pad([torch.tensor(x, dtype=torch.float32) for x in samp_lp], T)
        rho, _ = is_weights(PolicyBatch(logprobs=old, old_logprobs=old, advantages=torch.zeros(len(c_len)), mask=mask,
                                        max_length=cfg.max_new_tokens, sampler_logprobs=sampler),
                            c.rollout_correction, c.rollout_correction_cap)
    sizes = {len(g.completion_ids) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"per-token advantages need groups of one size, got sizes {sorted(sizes)}")
    rewards = torch.cat([g.rewards for g in groups]).float()
    ids = torch.zeros(len(c_len), T, dtype=torch.long)  # (N, T), 0 on padding
    for i, c in enumerate(c for g in groups for c in g.completion_ids):
        ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
    stats = {"old_logprobs": old, "sum_pi_squared": None if old_s2 is None else pad(old_s2, T),
             "old_entropy": pad(old_ent, T), "token_ids": ids}
    needs = objective.token_advantage_needs
    unknown = [n for n in needs if n not in stats or stats[n] is None]
    if unknown:
        raise ValueError(f"objective {objective.name!r}: the native loop does not compute {', '.join(unknown)}")
    tok_adv = objective.advantages_from_token_stats(rewards, mask, group_size=sizes.pop(), is_weights=rho,
                                                    **{n: stats[n] for n in needs})
    return tok_adv, mask


def step_tokens(groups: list[Group]) -> int:
    """Prompt + completion tokens of the completions that entered the update, each completion counted with its
    prompt (verl's ``global_token_num``: the attention mask's sum over the training batch)."""
    return sum(len(g.prompt_ids) * len(g.completion_ids) + sum(len(c) for c in g.completion_ids) for g in groups)


def roll_samples(groups: list[Group], tok, limit: int = 4) -> list[dict[str, Any]]:
    """A few completions per step for the samples artifact."""
    out = []
    for g in groups[:limit]:
        for text, r, c, a in zip(g.texts[:2], g.rewards[:2], g.correct[:2], g.advantages[:2]):
            out.append({"question": g.question, "completion": text, "reward": float(r), "correct": float(c),
                        "advantage": float(a)})
    return out
