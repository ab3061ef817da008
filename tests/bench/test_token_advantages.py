"""A per-token advantage estimator (verl's optimal token baselines) in the native engine: one update of the built-in
model with ``grpo`` / ``dr_grpo`` + ``advantage_estimator=optimal-token-baseline`` (or the TIR variant) hands the loss
a PolicyBatch whose ``token_advantages`` are ``token_baseline_advantages`` computed here from a separate scoring of the
same rollout (log π_old and Σπ_old² from the model's logits at the sampling temperature, the shaped reward on each
completion's last token, the rollout-correction IS weights when the objective has them); an objective without one
runs no extra scoring pass; the objectives whose loss reads one advantage per completion, and the TRL and verl
engines, refuse it before any work."""

from __future__ import annotations

import copy

import pytest
import torch

from algorithms import get_objective, sum_pi_squared, token_baseline_advantages
from bench.config import TrainConfig
from bench.engines.entry import check
from bench.engines.native import step as native_step
from bench.engines.native.scale import Reference
from bench.engines.native.step import Group, update
from bench.model import format_prompt, load_policy
from bench.rollout import SamplingParams, make_sampler
from tests.bench.record_grads import RecordGrads

OTB, TIR = "optimal-token-baseline", "tir-optimal-token-baseline"
TEMPERATURE = 1.3  # (not 1: the scoring must divide the logits by it)
P, G = 4, 4
CAP = 1.5  # the rollout-correction cap, low enough that some weights are truncated


@pytest.fixture(scope="module")
def rollout():
    """The built-in model and 4 prompts x 4 completions it sampled at TEMPERATURE, with rewards: group 0 all equal,
    the others mixed (identical completions, which a near-greedy model samples, get the same reward)."""
    model, tok = load_policy("builtin:tiny-arith")
    sampler = make_sampler("hf", model, tok)
    qs = ["Ann has 3 eggs, finds 4. How many now?", "Max has 15 cards, finds 93. How many now?",
          "Eve has 27 books, finds 3. How many now?", "Cy has 39 coins, gets 70, finds 60. How many now?"]
    ro = sampler.generate([format_prompt(tok, q, "plain") for q in qs], G,
                          SamplingParams(max_new_tokens=16, temperature=TEMPERATURE), seed=5)
    # a reward that is a function of the completion (as a verifier's): the same text the same reward; group 0 all 1
    rewards = torch.tensor([[1.0 if i < G else (sum(c) % 3) / 2 for i, c in enumerate(ro.completion_ids)]]).view(P, G)
    assert sum(len(set(r.tolist())) > 1 for r in rewards[1:]) >= 2  # mixed rewards elsewhere
    groups = []
    for p in range(P):
        sl = slice(G * p, G * p + G)
        groups.append(Group(qs[p], ro.prompt_ids[p], ro.completion_ids[sl], ro.texts[sl], rewards[p], rewards[p],
                            advantages=rewards[p].clone(), logprobs=ro.logprobs[sl], entropies=ro.entropies[sl],
                            truncated=torch.zeros(G, dtype=torch.bool)))
    assert len({len(c) for c in ro.completion_ids}) > 1  # completions of different lengths (padding)
    return model, tok, groups


class InexactSampler:
    """A sampler whose log-probs are not the training module's (as vLLM's)."""

    exact_logprobs = False

    def update_weights(self, model) -> None:
        pass


def expected(model, groups, estimator, sampler_shift=None, mode="none"):
    """(N, T) token advantages from an independent scoring: the model's logits of each (prompt + completion) row
    divided by TEMPERATURE; with ``mode`` the IS weights exp(old − sampler) truncated at CAP."""
    rows = [(g.prompt_ids, c) for g in groups for c in g.completion_ids]
    T = max(len(c) for _, c in rows)
    N = len(rows)
    old, s2, mask, r = (torch.zeros(N, T, dtype=torch.float64) for _ in range(4))
    rewards = torch.cat([g.rewards for g in groups]).double()
    with torch.no_grad():
        for i, (p, c) in enumerate(rows):
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:-1].double() / TEMPERATURE
            old[i, :len(c)] = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0]
            s2[i, :len(c)] = sum_pi_squared(logits)
            mask[i, :len(c)] = 1.0
            r[i, len(c) - 1] = rewards[i]
    rho = None
    if mode != "none":
        samp = torch.zeros(N, T, dtype=torch.float64)
        for i, (g_lp) in enumerate(lp for g in groups for lp in g.logprobs):
            samp[i, :len(g_lp)] = torch.tensor(g_lp, dtype=torch.float64)
        rho = (torch.exp((old - samp) * mask)).clamp(max=CAP)
        assert (rho == CAP).any() and (rho < 1).any()  # (the weights act)
    shape = (len(groups), G, T)
    adv, _ = token_baseline_advantages(estimator, r.view(shape), mask.view(shape), old.view(shape), s2.view(shape),
                                       is_weights=None if rho is None else rho.view(shape))
    # where the baseline is well conditioned: w = 1 − 2π + Σπ² (verl's formula) cancels to ~0 on a token the policy
    # is sure of (π ≈ 1), and float32 log-probs / Σπ² (the scoring pass's) leave it ~1e-7 off: where a group's Σ W at
    # t is below 1e-3 that error moves B_t by O(1), in verl as here (the zero tail, B_t = 0, is always compared)
    w = (1 - 2 * old.exp() + s2) * (1.0 if rho is None else rho ** 2)
    den = (mask * (w * mask).cumsum(-1)).view(shape).sum(1, keepdim=True)
    good = (den >= 1e-3).expand(shape).reshape(N, T) | (adv.view(N, T) == r.view(N, T).flip(-1).cumsum(-1).flip(-1))
    return adv.view(N, T), old, mask, mask * good


def run(rollout, algo, overrides, monkeypatch, exact=True, groups=None, losses=None, **fields):
    """One ``update`` (step 1); returns the PolicyBatches the loss received and the no-gradient scoring calls (and
    appends the loss of each to ``losses`` when given)."""
    model, tok, base_groups = rollout
    cfg = TrainConfig(algo=algo, objective_overrides=overrides, max_new_tokens=16, temperature=TEMPERATURE,
                      prompts_per_step=P, group_size=G, max_grad_norm=0.0, **fields)
    objective = get_objective(algo, **overrides)
    batches, passes = [], []
    loss = objective.checked_loss

    def recording_loss(batch, generator=None):
        batches.append(batch)
        out = loss(batch, generator=generator)
        if losses is not None:
            losses.append(out[0].detach())
        return out

    monkeypatch.setattr(objective, "checked_loss", recording_loss)
    for name in ("score", "score_shared"):
        real = getattr(native_step, name)

        def counting(*a, _real=real, **kw):
            if not kw.get("grad", False):
                passes.append((len(a[2]), kw.get("sum_pi_squared", False)))
            return _real(*a, **kw)

        monkeypatch.setattr(native_step, name, counting)
    ref = Reference(model) if objective.needs_reference else None
    sampler = make_sampler("hf", model, tok) if exact else InexactSampler()
    state = copy.deepcopy(model.state_dict())
    out = update(cfg, objective, model, ref, RecordGrads(model.parameters()), sampler,
                 copy.deepcopy(groups or base_groups), 1)
    model.load_state_dict(state)
    model.zero_grad(set_to_none=True)
    return batches, passes, out


def rows_of(batch, old, mask):
    """The rollout row of each batch row: the one whose π_old log-probs (and length) it carries."""
    out = []
    for b in range(batch.mask.shape[0]):
        n = int(batch.mask[b].sum())
        d = [(float((old[i, :n] - batch.old_logprobs[b, :n].double()).abs().max()), i)
             for i in range(old.shape[0]) if int(mask[i].sum()) == n]
        err, i = min(d)
        assert err < 1e-4
        out.append(i)
    return out


def assert_token_advantages(batches, want, old, mask, good):
    """Every row of every batch the loss received carries the expected Â_it on its well-conditioned tokens (``good``),
    0 on padding; every rollout row is seen; over half the tokens are compared. (Tolerance: float32 scoring.)"""
    seen, rows = set(), 0
    assert good.sum() > 0.5 * mask.sum()  # (the built-in model is sure of its first tokens: w ≈ 0 there)
    for batch in batches:
        rows += batch.mask.shape[0]
        assert batch.token_advantages is not None
        for b, i in enumerate(rows_of(batch, old, mask)):
            n = int(mask[i].sum())
            on = good[i, :n] > 0
            torch.testing.assert_close(batch.token_advantages[b, :n][on].double(), want[i, :n][on], atol=1e-4,
                                       rtol=1e-3)
            assert (batch.token_advantages[b, n:] == 0).all()
            seen.add(i)
    # every row, once per epoch (identical completions of one prompt, which get the same reward, map to the first)
    N = want.shape[0]
    first = {i: min(j for j in range(N) if int(mask[j].sum()) == int(mask[i].sum())
                    and torch.equal(old[j], old[i])) for i in range(N)}
    assert rows > 0 and rows % N == 0 and seen == set(first.values())


CASES = [  # (algo, estimator, fields): on-policy; off-policy (2 minibatches, 2 epochs), shared prefix; inexact sampler
    ("dr_grpo", OTB, dict(minibatches=1, micro_batch_size=64)),
    ("grpo", TIR, dict(minibatches=2, update_epochs=2, micro_batch_size=3, shared_prefix=True)),
    ("dr_grpo", OTB, dict(minibatches=1, micro_batch_size=5, exact=False, skip_zero_advantage=True)),
]


@pytest.mark.parametrize(("algo", "estimator", "fields"), CASES, ids=["on-policy", "off-policy-tir", "inexact-skip"])
def test_the_loss_receives_the_token_baseline_advantages_of_an_independent_scoring(rollout, monkeypatch, algo,
                                                                                      estimator, fields):
    model, _, groups = rollout
    want, old, mask, good = expected(model, groups, estimator)
    assert not torch.allclose(want, want[:, :1].expand_as(want) * mask)  # B_t varies along the completions
    batches, passes, out = run(rollout, algo, {"advantage_estimator": estimator}, monkeypatch, **fields)
    # one π_old pass with Σπ² over every row, no other one (ref: grpo's KL reference, the same rows once more)
    assert sum(n for n, s2 in passes if s2) == P * G
    assert sum(n for n, s2 in passes if not s2) == (P * G if algo == "grpo" else 0)
    # before the first optimizer step the batches' π_old rows identify the rollout rows; later ones too (π_old is fixed)
    assert_token_advantages(batches, want, old, mask, good)
    assert all(torch.isfinite(torch.tensor(v)) for v in out.values())


def test_the_rollout_correction_weights_enter_the_baseline(rollout, monkeypatch):
    """With token-truncate, W_it sums w_it·ρ_it², ρ = min(exp(old − sampler), C): the sampler's log-probs are made
    off by a per-token shift here (a sampler whose numerics differ)."""
    model, _, groups = rollout
    g = torch.Generator().manual_seed(1)
    shifted = copy.deepcopy(groups)
    for grp in shifted:
        grp.logprobs = [[x + float(0.8 * torch.randn((), generator=g)) for x in lp] for lp in grp.logprobs]
    want, old, mask, good = expected(model, shifted, OTB, mode="token-truncate")
    plain, *_ = expected(model, shifted, OTB)
    assert not torch.allclose(want, plain, atol=1e-3)
    overrides = {"advantage_estimator": OTB, "rollout_correction": "token-truncate", "rollout_correction_cap": CAP}
    batches, _, _ = run(rollout, "dr_grpo", overrides, monkeypatch, exact=False, groups=shifted, minibatches=1,
                        micro_batch_size=64)
    assert_token_advantages(batches, want, old, mask, good)


def test_an_objective_without_a_token_estimator_runs_no_extra_pass(rollout, monkeypatch):
    batches, passes, _ = run(rollout, "dr_grpo", {}, monkeypatch, minibatches=1, micro_batch_size=64)
    assert passes == [] and all(b.token_advantages is None for b in batches)


@pytest.mark.parametrize(("algo", "why"), [("tepo", "likelihood credit"), ("ppo", "GAE"), ("clip_cov", "covariance")])
def test_objectives_reading_one_advantage_per_completion_refuse_it_before_any_work(tmp_path, algo, why):
    cfg = TrainConfig(algo=algo, objective_overrides={"advantage_estimator": OTB}, output_dir=str(tmp_path),
                      tracking_uri=f"sqlite:///{tmp_path}/m.db")
    with pytest.raises(ValueError, match=why):
        check(cfg)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("engine", "why"), [("trl", "--engine trl does not support .* per-token estimator"),
                                             ("verl", "averages verl's per-token advantages")])
def test_trl_and_verl_refuse_a_token_estimator_before_any_work(tmp_path, engine, why):
    cfg = TrainConfig(algo="grpo", engine=engine, objective_overrides={"advantage_estimator": OTB},
                      output_dir=str(tmp_path), tracking_uri=f"sqlite:///{tmp_path}/m.db")
    with pytest.raises(ValueError, match=why):
        check(cfg)
    assert not any(tmp_path.iterdir())


def test_a_short_native_run_trains_with_a_token_estimator(tmp_path):
    """Two steps of the native loop end to end (sampling, the scoring pass, the update, metrics, samples)."""
    from bench.engines.entry import train
    from tests.conftest import fresh_store

    cfg = TrainConfig(algo="dapo", objective_overrides={"advantage_estimator": OTB}, steps=2, prompts_per_step=4,
                      group_size=4, max_new_tokens=16, eval_every=0, checkpoint_every=0, samples_every=1,
                      output_dir=str(tmp_path / "run"), tracking_uri=fresh_store(tmp_path / "mlflow"),
                      experiment="test-otb", run_name="otb")
    res = train(cfg)
    assert res.steps_done == 2
