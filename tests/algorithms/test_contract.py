"""Contract every registered objective must meet (a new objective is tested the day it is registered)."""

from __future__ import annotations

import pytest
import torch

from algorithms import PolicyBatch, get_objective, list_objectives

from .conftest import as_batch, random_batch, with_groups

ALL = list_objectives()
NO_GRAD_FIELDS = ("old_logprobs", "ref_logprobs", "old_entropy", "ref_entropy", "advantages", "token_advantages")


def run(name: str, t: dict, seed: int = 0):
    obj = get_objective(name)
    return obj, *obj.loss(as_batch(with_groups(obj, t)), generator=torch.Generator().manual_seed(seed))


V1 = ["grpo", "dr_grpo", "dapo", "gspo", "entropy_reg", "clip_cov", "kl_cov", "forking_tokens", "tepo"]
FROM_TRL_VERL = ["bnpo", "luspo", "ppo_dual_clip", "cispo", "sapo", "gmpo", "gpg", "vespo", "rloo", "reinforce_pp",
                 "reinforce_pp_baseline", "grpo_passk", "opo", "remax"]


def test_every_named_objective_registered():
    assert set(V1 + FROM_TRL_VERL) <= set(ALL)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finite_loss_and_scalar_metrics(name, seed):
    _, loss, metrics = run(name, random_batch(seed=seed))
    assert loss.dim() == 0 and torch.isfinite(loss)
    for key, value in metrics.items():
        assert key.startswith("objective/"), key
        assert isinstance(value, torch.Tensor) and value.dim() == 0, key
        assert not value.requires_grad, key
        assert torch.isfinite(value), key
    for key in ("objective/policy_loss", "objective/kl_term", "objective/entropy", "objective/clip_frac_low",
                "objective/clip_frac_high", "objective/ratio_mean", "objective/ratio_max"):
        assert key in metrics, key


@pytest.mark.parametrize("name", ALL)
def test_gradients_reach_current_policy_only(name):
    t = random_batch(seed=3)
    obj, loss, _ = run(name, t)
    loss.backward()
    assert t["logprobs"].grad is not None and t["logprobs"].grad.abs().sum() > 0
    for field in NO_GRAD_FIELDS:
        g = t[field].grad
        assert g is None or torch.all(g == 0), f"{name}: gradient leaked into {field}"
    g = t["entropy"].grad
    if obj.needs_entropy_grad:
        assert g is not None and g.abs().sum() > 0
    else:
        assert g is None or torch.all(g == 0), f"{name}: gradient leaked into the entropy"
    # nothing flows through padded positions
    assert torch.all(t["logprobs"].grad[t["mask"] == 0] == 0)


@pytest.mark.parametrize("name", ALL)
def test_padding_invariance(name):
    t = random_batch(seed=4, requires_grad=False)
    _, loss, metrics = run(name, t)
    g = torch.Generator().manual_seed(99)
    B, T = t["mask"].shape
    extra = 5
    padded = {}
    for k, v in t.items():
        if k in ("max_length", "advantages"):
            padded[k] = v
        elif k == "mask":
            padded[k] = torch.cat([v, torch.zeros(B, extra)], dim=1)
        else:  # garbage in the padded positions must not matter
            padded[k] = torch.cat([v, -torch.rand(B, extra, generator=g) * 5], dim=1)
    _, loss_p, metrics_p = run(name, padded)
    torch.testing.assert_close(loss_p, loss)
    for key in metrics:
        torch.testing.assert_close(metrics_p[key], metrics[key], msg=key)


@pytest.mark.parametrize("name", [n for n in ALL if get_objective(n).split_invariant
                                  and not get_objective(n).needs_whole_groups])
def test_batch_split_invariance(name):
    """Any split; an objective whose loss couples a group is split at group boundaries in the next test."""
    t = random_batch(B=8, seed=5)
    obj = get_objective(name)
    full = as_batch(t)
    loss, _ = obj.loss(full)
    (grad_full,) = torch.autograd.grad(loss, t["logprobs"])
    halves = []
    for sl in (slice(0, 3), slice(3, 8)):
        part = {k: (v[sl] if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
        b = PolicyBatch(**part)
        halves.append((obj.loss(b)[0], obj.loss_weight(b.mask)))
    total_w = sum(w for _, w in halves)
    combined = sum(l * w for l, w in halves) / total_w
    torch.testing.assert_close(combined, loss)
    (grad_split,) = torch.autograd.grad(combined, t["logprobs"])
    torch.testing.assert_close(grad_split, grad_full)


@pytest.mark.parametrize("name", [n for n in ALL if get_objective(n).needs_whole_groups])
def test_batch_split_invariance_at_group_boundaries(name):
    t = random_batch(B=8, seed=5)
    obj = get_objective(name)
    loss, _ = obj.loss(as_batch(with_groups(obj, t)))
    (grad_full,) = torch.autograd.grad(loss, t["logprobs"])
    parts = []
    for sl in (slice(0, 2), slice(2, 8)):
        b = as_batch(with_groups(obj, {k: (v[sl] if isinstance(v, torch.Tensor) else v) for k, v in t.items()}))
        parts.append((obj.loss(b)[0], obj.loss_weight(b.mask)))
    combined = sum(lo * w for lo, w in parts) / sum(w for _, w in parts)
    torch.testing.assert_close(combined, loss)
    (grad_split,) = torch.autograd.grad(combined, t["logprobs"])
    torch.testing.assert_close(grad_split, grad_full)


def test_selective_objectives_declare_batch_dependence():
    assert {n for n in ALL if not get_objective(n).split_invariant} == {"clip_cov", "kl_cov", "forking_tokens"}


def test_missing_tensor_names_the_objective():
    t = random_batch(seed=6)
    t["ref_logprobs"] = None
    with pytest.raises(ValueError, match="'grpo' needs PolicyBatch.ref_logprobs"):
        get_objective("grpo").loss(as_batch(t))


def test_bad_shapes_rejected():
    t = random_batch(seed=6)
    t["advantages"] = t["advantages"][:3]
    with pytest.raises(ValueError, match="advantages"):
        as_batch(t)


def _variants(name: str) -> list[dict]:
    """Registry defaults, then each setting that changes what a loss reads, where the objective has it."""
    config = get_objective(name).config
    out = [{}]
    for key, value in (("kl_coef", 0.05), ("entropy_coef", 0.01), ("entropy_target", 0.5), ("mask_truncated", True),
                       ("rollout_correction", "token-truncate")):
        if hasattr(config, key):
            out.append({key: value})
    if hasattr(config, "kl_mask"):  # TEPO: every mask, baseline and target
        out += [{"kl_coef": 0.05, "kl_mask": m, "entropy_baseline": b, "kl_target": t}
                for m in ("all", "adv", "entropy", "adv-entropy") for b in ("ref", "old") for t in ("ref", "old")]
    return [o for o in out if _builds(name, o)]


def _builds(name: str, overrides: dict) -> bool:
    try:
        get_objective(name, **overrides)
    except ValueError:  # (an option this objective refuses, in one line)
        return False
    return True


OPTIONAL = ("ref_logprobs", "entropy", "old_entropy", "ref_entropy", "sampler_logprobs", "truncated",
            "token_advantages")


def _batch_with(fields, seed: int = 5, obj=None) -> PolicyBatch:
    t = random_batch(seed=seed)
    if obj is not None:
        t = with_groups(obj, t)
    t = {k: v for k, v in t.items() if k not in OPTIONAL or k in fields}
    if "sampler_logprobs" in fields:
        t["sampler_logprobs"] = (t["old_logprobs"] + 0.05).detach()
    if "truncated" in fields:
        t["truncated"] = torch.tensor([True, False, False, True, False, False])
    return as_batch(t)


def _uses(obj, batch: PolicyBatch) -> None:
    obj.loss(batch, generator=torch.Generator().manual_seed(0))
    obj.state_sums(batch)


@pytest.mark.parametrize("name", ALL)
def test_the_declared_batch_fields_are_exactly_what_the_loss_reads(name):
    """``batch_fields`` is the one declaration every engine reads (verl's plan among them, which used to call the loss
    and parse its error text): a batch with exactly those fields is enough, and each of them is needed."""
    for overrides in _variants(name):
        obj = get_objective(name, **overrides)
        declared = obj.batch_fields
        assert declared <= set(OPTIONAL), (name, overrides, declared)
        _uses(obj, _batch_with(declared, obj=obj))  # enough
        for field in declared:  # each one needed
            with pytest.raises(ValueError, match=field):
                _uses(obj, _batch_with(declared - {field}, obj=obj))


@pytest.mark.parametrize("name", ALL)
def test_a_separable_kl_is_beta_times_the_plain_kl_to_the_reference(name):
    """``separable_kl`` = β says: the loss equals the loss with kl_coef = 0 plus β·KL(π_θ‖π_ref) aggregated as the
    loss is (an engine then runs the KL as its own loss): checked on a batch, for every objective that says so."""
    from algorithms.aggregation import aggregate
    from algorithms.kl import kl_estimate

    for overrides in _variants(name):
        obj = get_objective(name, **overrides)
        beta = obj.separable_kl
        if not beta:
            continue
        plain = get_objective(name, **{**overrides, "kl_coef": 0.0})
        batch = _batch_with(OPTIONAL)
        gen = torch.Generator().manual_seed(0)
        got = obj.loss(batch, generator=gen)[0]
        kl = kl_estimate(batch.logprobs, batch.ref_logprobs, obj.config.kl_estimator)
        want = plain.loss(batch, generator=torch.Generator().manual_seed(0))[0] + \
            beta * aggregate(kl, batch.mask, obj.config.aggregation, batch.max_length)
        torch.testing.assert_close(got, want, msg=f"{name} {overrides}")


def test_an_engine_builds_the_batch_one_way_and_a_missing_field_names_it():
    """``batch_for``, the one builder every engine calls: a declared field the engine did not compute is one line
    naming the objective, the field and the engine, before the loss runs; H_θ keeps its gradient only for an
    objective whose entropy bonus needs it."""
    from algorithms import batch_for

    t = random_batch(seed=1)
    core = {k: t[k] for k in ("logprobs", "old_logprobs", "advantages", "mask", "max_length")}
    tepo = get_objective("tepo")
    with pytest.raises(ValueError, match=r"objective 'tepo' needs PolicyBatch\.entropy, ref_entropy, ref_logprobs, "
                                         r"which the test engine did not compute"):
        batch_for(tepo, "test engine", **core, old_entropy=t["old_entropy"])
    plain = batch_for(get_objective("grpo"), "e", **core, entropy=t["entropy"], ref_logprobs=t["ref_logprobs"])
    bonus = batch_for(get_objective("entropy_reg"), "e", **core, entropy=t["entropy"], ref_logprobs=t["ref_logprobs"])
    assert not plain.entropy.requires_grad and bonus.entropy.requires_grad
