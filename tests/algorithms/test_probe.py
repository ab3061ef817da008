"""The distinguishability probe: its batch has the regime's properties, its gradients are the objectives' true
gradients, and it reports the coinciding groups and inert terms measured on identical float64 tensors."""

from __future__ import annotations

import pytest
import torch

from algorithms import get_objective
from algorithms.probe import Regime, gradient, make_batch, probe, relative_difference

# the objectives whose on-policy coincidences docs/objectives.md lists (a fixed list: objectives registered later, e.g.
# KL to π_old, coincide on-policy for reasons of their own)
FIRST_SET = ["grpo", "dr_grpo", "dapo", "gspo", "entropy_reg", "clip_cov", "kl_cov", "forking_tokens", "tepo",
             "tepo-no-mask", "tepo-mask-all", "tepo-mask-adv", "tepo-mask-entropy", "tepo-token-ratio",
             "tepo-seq-mean", "tepo-likelihood-credit", ("grpo", {"kl_coef": 0.0})]
ONE_UPDATE = Regime.from_loop(update_epochs=1, minibatches=1, lr=3e-5, prompts_per_step=16, group_size=8,
                              micro_batch_size=64, max_new_tokens=48)
DEFAULT = Regime.from_loop(update_epochs=1, minibatches=4, lr=3e-5, prompts_per_step=16, group_size=8,
                           micro_batch_size=64, max_new_tokens=48)


@pytest.fixture(scope="module")
def one_update():
    return probe(FIRST_SET, ONE_UPDATE)


@pytest.fixture(scope="module")
def default():
    return probe(FIRST_SET, DEFAULT)


def test_regime_from_loop_counts_updates_and_micro_batch():
    assert ONE_UPDATE.on_policy and ONE_UPDATE.completions == 64
    assert DEFAULT.updates_before == 3 and DEFAULT.completions == 32  # 128 completions / 4 mini-batches
    assert Regime.from_loop(update_epochs=2, minibatches=4, lr=1e-4, prompts_per_step=16, group_size=8,
                            micro_batch_size=16, max_new_tokens=48).updates_before == 7
    assert DEFAULT.log_ratio_scale == pytest.approx(3 * DEFAULT.log_ratio_per_update)


def test_probe_batch_has_the_regime_properties():
    on, off = make_batch(ONE_UPDATE), make_batch(DEFAULT)
    assert torch.equal(on.old_logprobs, on.logprobs) and torch.equal(on.old_entropy, on.entropy)
    m = off.mask
    assert ((off.logprobs - off.old_logprobs).abs() * m).sum() / m.sum() == pytest.approx(DEFAULT.log_ratio_scale)
    assert ((off.logprobs - off.old_logprobs) * (1 - m)).abs().max() == 0  # padding does not move
    assert (off.logprobs[m > 0] <= 0).all() and (off.entropy[m > 0] >= 0).all()
    assert m.sum(-1).max() == DEFAULT.max_length and m.sum(-1).min() < DEFAULT.max_length  # padding present
    assert torch.equal(make_batch(DEFAULT).old_logprobs, off.old_logprobs)  # deterministic for a seed


def test_gradient_is_the_objective_gradient():
    """DAPO on-policy: ∂L/∂lp_it = −Â_i·m_it / Σ m (token-mean of −r·Â); no entropy gradient."""
    pb = make_batch(ONE_UPDATE)
    g, _ = gradient("dapo", {}, [pb])
    adv = get_objective("dapo").advantages(pb.rewards).reshape(-1, 1)
    expected = -adv * pb.mask / pb.mask.sum()
    n = pb.mask.numel()
    assert torch.allclose(g[:n].view_as(pb.mask), expected, atol=1e-15)
    assert g[n:].abs().max() == 0
    g_ent, _ = gradient("entropy_reg", {}, [pb])  # the entropy bonus differentiates the entropies
    assert g_ent[n:].abs().max() > 0


def test_one_update_regime_reports_exactly_the_documented_groups(one_update):
    groups = {frozenset(g) for g in one_update.groups}
    assert groups == {frozenset({"dapo", "kl_cov", "tepo-no-mask"}), frozenset({"tepo", "tepo-token-ratio"}),
                      frozenset({"gspo", "grpo(kl_coef=0.0)"})}
    # the closest pair that does not coincide is far above the tolerance (no accidental near-ties)
    others = [d for (a, b), d in one_update.distance.items() if not any({a, b} <= set(g) for g in groups)]
    assert min(others) > 1e3 * one_update.tolerance


def test_one_update_regime_reports_inert_terms(one_update):
    inert = one_update.inert
    clipped = [lab for lab in one_update.labels if lab not in one_update.no_clip]
    assert one_update.no_clip == ["kl_cov"]  # (its default surrogate is the paper's unclipped −r·Â)
    assert all(any("clip never binds" in t for t in inert[lab]) for lab in clipped)
    assert any(t.startswith("kl_cov_coef=") for t in inert["kl_cov"])  # |lp − old| is 0 on-policy
    assert any("tepo-token-ratio" in t for t in inert["tepo"])  # the sequence-likelihood link is inert
    assert not any(t.startswith("kl_coef=") for t in inert["grpo"])  # KL to the reference acts
    warnings = one_update.warnings()
    assert any("dapo == kl_cov == tepo-no-mask" in w and "dynamic_sampling" in w for w in warnings)


def test_default_regime_separates_the_documented_groups(default):
    assert default.groups == []
    assert not any("clip never binds" in t for t in default.inert["dapo"])  # token clips bind off-policy
    assert not any("clip never binds" in t for t in default.inert["gspo"])
    assert not any(t.startswith("kl_cov_coef=") for t in default.inert["kl_cov"])


def test_inert_kl_and_tiny_selection_are_reported():
    res = probe(["grpo", ("clip_cov", {"clip_cov_frac": 1e-6}), ("forking_tokens", {"forking_frac": 0.5})],
                Regime(updates_before=0, ref_log_ratio=0.0, completions=16), ablations=False)
    assert any(t.startswith("kl_coef=0.04") for t in res.inert["grpo"])  # π_θ = π_ref: the KL term does nothing
    tiny = [t for t in res.inert["clip_cov(clip_cov_frac=1e-06)"] if t.startswith("detached_frac: selects")]
    assert len(tiny) == 1 and float(tiny[0].split()[2]) <= 1  # 1e-6 of ~800 tokens: at most one
    assert not any("selects" in t for t in res.inert["forking_tokens(forking_frac=0.5)"])


def test_relative_difference():
    a = torch.tensor([1.0, 2.0, 2.0])
    assert relative_difference(a, a) == 0 and relative_difference(a * 0, a * 0) == 0
    assert relative_difference(a, 2 * a) == pytest.approx(0.5)


def test_every_registered_objective_is_probed_including_length_and_greedy_estimators():
    """REINFORCE++ and OPO need completion lengths, ReMax a greedy reward per prompt: the probe supplies them (it
    stopped with "needs completion lengths" before), so `bench list --compare` covers every registered objective."""
    from algorithms import list_objectives

    names = list_objectives()
    assert {"reinforce_pp", "opo", "remax"} <= set(names)
    res = probe(names, DEFAULT, ablations=False, batches=1)
    assert res.labels == names and all(v == v for v in res.distance.values())  # every pair compared, no NaN


def test_probe_advantage_inputs_are_the_batch_lengths_and_the_majority_outcome():
    from algorithms.probe import _advantage_inputs

    pb = make_batch(DEFAULT)
    P, G = pb.rewards.shape
    lengths = _advantage_inputs(get_objective("opo"), pb)["lengths"]
    for i in range(P * G):  # completion i of prompt i // G: its number of real tokens
        assert lengths[i // G, i % G] == int((pb.mask[i] > 0).sum())
    greedy = _advantage_inputs(get_objective("remax"), pb)["greedy_rewards"]
    assert greedy.tolist() == [1.0 if 2 * row.sum() > G else 0.0 for row in pb.rewards]
    assert _advantage_inputs(get_objective("grpo"), pb) == {}


# the objectives issue 31 added (and grpo, their common base): where `bench list --compare` places them
ISSUE31 = ["grpo", "maxrl", "topr", "up_grpo", "cfpo", "ppo", "dppo_tv", "dppo_kl", "dro"]


def test_objectives_added_since_trl_and_verl_are_placed_in_the_table():
    """On-policy, CFPO's penalty has zero slope at r = 1 and UP-GRPO's self-anchored ratio is the ratio, so both are
    grpo; DPPO's masks and DRO's penalty are empty at r = 1, so the three are token-mean REINFORCE. Off-policy (the
    default regime) no two coincide; ppo (per-token GAE advantages from its critic's zero-initialised head) is
    placed in both."""
    on = probe(ISSUE31, ONE_UPDATE, ablations=False)
    assert {frozenset(g) for g in on.groups} == {frozenset({"grpo", "up_grpo", "cfpo"}),
                                                 frozenset({"dppo_tv", "dppo_kl", "dro"})}
    off = probe(ISSUE31, DEFAULT, ablations=False)
    assert off.groups == [] and off.labels == ISSUE31
    assert all(v == v and v > 1e3 * off.tolerance for v in off.distance.values())


def test_bench_list_compare_prints_a_row_for_ppo_and_cfpo(capsys):
    from bench.cli import main

    assert main(["list", "--compare", "ppo,cfpo,grpo", "--minibatches", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip() and not line.startswith("WARNING")}
    assert set(rows) == {"ppo", "cfpo", "grpo"}
    assert "cfpo == grpo" in out


def test_a_per_token_estimator_is_probed_with_its_token_advantages():
    """DAPO with the optimal token baseline, on-policy: ∂L/∂lp_it = −Â_it·m_it / Σ m, Â_it its
    ``advantages_from_token_stats`` on the probe batch (Σπ² from H_old, within [π², π² + (1 − π)²]); a gradient of its
    own, not DAPO's."""
    pb = make_batch(ONE_UPDATE)
    otb = {"advantage_estimator": "optimal-token-baseline"}
    g, _ = gradient("dapo", otb, [pb])
    obj = get_objective("dapo", **otb)
    p = pb.old_logprobs.exp()
    s2 = torch.exp(-pb.old_entropy).clamp(min=p.square()).minimum(p.square() + (1 - p).square()) * pb.mask
    tok = obj.advantages_from_token_stats(pb.rewards.reshape(-1), pb.mask, pb.old_logprobs, s2,
                                          group_size=pb.rewards.shape[1])
    n = pb.mask.numel()
    assert torch.allclose(g[:n].view_as(pb.mask), -tok * pb.mask / pb.mask.sum(), atol=1e-15)
    assert relative_difference(g, gradient("dapo", {}, [pb])[0]) > 0.05


def test_an_objective_without_a_clip_is_not_called_inert_for_it():
    """An objective whose policy term has no clip (``has_clip`` False: TOPR, GPG, SAPO, VESPO, DRO, GTPO, KL-Cov's
    unclipped surrogate) logs clip fractions of 0 by construction: the probe said "clip never binds" of each, a
    finding the data cannot support. Its row says "no clip" instead, and the claim is checked: its clip fractions
    are 0 in the off-policy regime where clipped objectives' clips bind."""
    from algorithms.registry import list_objectives

    names = [n for n in list_objectives() if not getattr(get_objective(n), "has_clip", True)]
    assert {"topr", "gpg", "sapo", "vespo", "dro", "gtpo", "kl_cov", "tpo"} <= set(names)
    res = probe([*names, "grpo", ("kl_cov", {"surrogate": "clipped"})], DEFAULT, ablations=False)
    for lab in names:
        assert not any("clip never binds" in t for t in res.inert[lab]), (lab, res.inert[lab])
        fracs = [v for k, v in res.metrics[lab].items() if k.endswith(("clip_frac_low", "clip_frac_high"))]
        assert all(v == 0 for v in fracs), (lab, fracs)
    rows = {r[0]: r for r in res.rows()}
    assert all(rows[lab][3] == "no clip" for lab in names)
    assert rows["grpo"][3] != "no clip" and rows["kl_cov(surrogate=clipped)"][3] != "no clip"
