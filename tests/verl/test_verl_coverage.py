"""Every policy loss and advantage estimator verl ships is checked against pobench, or named as not included.

verl's registries are read at test time (``core_algos.POLICY_LOSS_REGISTRY``, ``ADV_ESTIMATOR_REGISTRY`` and the
``AdvantageEstimator`` enum; only what verl itself registers: pobench's ``pobench_*`` losses, which importing
``bench.engines.verl`` adds, are not verl's). Each name must be in ``COVERED`` (the pobench objectives / estimators it
is compared with and the parity tests that compare them) or in ``NOT_INCLUDED`` (the reason, which docs/objectives.md
must give in its "Not included" text). A verl upgrade that registers a new loss or estimator fails here instead of
passing silently; an entry for a name verl no longer registers fails too.

The mapping is checked, not only listed: each named test exists in its file, the file names the verl loss or
estimator (its registry name as a string, the registered function, or a pobench table of verl names the file reads),
and the pobench names are registered. ``COVERED.left_out`` names the options of a covered verl entry that pobench
does not reproduce; each must appear in docs/objectives.md's "Not included" text too.

Also here: verl's ``grpo_vectorized`` and ``rloo_vectorized`` (the same estimators as ``grpo`` / ``rloo``, computed in
float32 with group scatter ops) against ours, and where a group of one completion gets different advantages.

Runs in `tox -e verl`; skipped where verl is absent.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (tox -e verl)")

from verl.trainer.config import AlgoConfig  # noqa: E402

import bench.engines.verl as pobench_verl  # noqa: E402
from algorithms import estimator_names, group_advantages, list_objectives  # noqa: E402

pytestmark = pytest.mark.verl
ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "objectives.md"


@dataclass(frozen=True)
class Covered:
    pobench: tuple[str, ...]  # pobench objectives or advantage estimators it is compared with
    tests: tuple[str, ...]  # "path::test_function" of the parity tests
    via: str | None = None  # a bench.engines.verl table of verl names the test file reads (instead of the name)
    left_out: tuple[str, ...] = ()  # options of the verl entry not reproduced: phrases of docs' "Not included"


PARITY = "tests/verl/test_verl_parity.py"
BYPASS = "tests/verl/test_verl_gdpo_bypass.py"
COV = "tests/verl/test_verl_cov.py"
ME = "tests/verl/test_verl_coverage.py"

#: verl policy loss -> what checks it
POLICY_LOSSES: dict[str, Covered] = {
    "vanilla": Covered(("ppo_dual_clip", "grpo", "dr_grpo"), (f"{PARITY}::test_policy_loss_matches_verl",
                                                             f"{PARITY}::test_rollout_correction_matches_verl")),
    "gspo": Covered(("gspo",), (f"{PARITY}::test_policy_loss_matches_verl",)),
    "sapo": Covered(("sapo",), (f"{PARITY}::test_policy_loss_matches_verl",)),
    "gpg": Covered(("gpg",), (f"{PARITY}::test_policy_loss_matches_verl",)),
    "geo_mean": Covered(("gmpo",), (f"{PARITY}::test_policy_loss_matches_verl",)),
    "cispo": Covered(("cispo",), (f"{PARITY}::test_policy_loss_matches_verl",)),
    "dppo_tv": Covered(("dppo_tv",), (f"{PARITY}::test_policy_loss_matches_verl",)),
    "dppo_kl": Covered(("dppo_kl",), (f"{PARITY}::test_policy_loss_matches_verl",)),
    "dro": Covered(("dro",), (f"{PARITY}::test_policy_loss_matches_verl",)),
    "clip_cov": Covered(("clip_cov",), (f"{COV}::test_clip_cov_matches_verl",
                                        f"{COV}::test_clip_cov_with_rollout_correction_matches_verl")),
    "kl_cov": Covered(("kl_cov",), (f"{COV}::test_kl_cov_matches_verl",
                                    f"{COV}::test_kl_cov_with_rollout_correction_matches_verl")),
    "bypass_mode": Covered(
        ("reinforce_is", "ppo_dual_clip", "gpg", "cispo"),
        (f"{BYPASS}::test_bypass_ppo_clip_is_the_clipped_surrogate_on_the_sampler_logprobs",
         f"{BYPASS}::test_bypass_reinforce_without_is_is_the_reinforce_term",
         f"{BYPASS}::test_bypass_reinforce_with_token_tis_is_cispo_without_a_lower_clip",
         f"{BYPASS}::test_bypass_reinforce_is_reinforce_is"),
        left_out=("rollout_rs", "rollout_is_batch_normalize")),
}

#: verl advantage estimator -> what checks it
ESTIMATORS: dict[str, Covered] = {
    "gae": Covered(("ppo",), ("tests/verl/test_verl_gae.py::test_gae_equals_verl",
                              "tests/verl/test_verl_gae.py::test_gae_with_gaps_in_the_mask_equals_verl")),
    "grpo": Covered(("group", "group-no-std"), (f"{PARITY}::test_advantage_estimator_matches_verl",)),
    "rloo": Covered(("rloo",), (f"{PARITY}::test_advantage_estimator_matches_verl",
                                f"{PARITY}::test_one_completion_per_prompt_matches_verl")),
    "reinforce_plus_plus": Covered(("reinforce++",), (f"{PARITY}::test_advantage_estimator_matches_verl",)),
    "reinforce_plus_plus_baseline": Covered(("reinforce++-baseline",),
                                            (f"{PARITY}::test_advantage_estimator_matches_verl",
                                             f"{PARITY}::test_one_completion_per_prompt_matches_verl")),
    "grpo_passk": Covered(("grpo-passk",), (f"{PARITY}::test_advantage_estimator_matches_verl",)),
    "opo": Covered(("opo",), (f"{PARITY}::test_advantage_estimator_matches_verl",)),
    "gpg": Covered(("gpg",), (f"{PARITY}::test_advantage_estimator_matches_verl",)),
    "remax": Covered(("remax",), (f"{PARITY}::test_remax_matches_verl",)),
    "grpo_vectorized": Covered(("group", "group-no-std"), (f"{ME}::test_vectorized_estimator_matches_verl",)),
    "rloo_vectorized": Covered(("rloo",), (f"{ME}::test_vectorized_estimator_matches_verl",)),
    "gdpo": Covered(("gdpo",), (f"{BYPASS}::test_gdpo_matches_verl", f"{BYPASS}::test_gdpo_objective_matches_verl",
                                f"{BYPASS}::test_gdpo_groups_of_one_match_verl")),
    "optimal_token_baseline": Covered(
        ("optimal-token-baseline",), ("tests/verl/test_verl_token_baseline.py::test_token_baseline_matches_verl",),
        via="TOKEN_ADV_ESTIMATORS"),
    "tir_optimal_token_baseline": Covered(
        ("tir-optimal-token-baseline",),
        ("tests/verl/test_verl_token_baseline.py::test_token_baseline_with_gaps_in_the_mask_matches_verl",),
        via="TOKEN_ADV_ESTIMATORS"),
}

#: verl name -> the reason it is left out, as docs/objectives.md's "Not included" text gives it (none today: every
#: loss and estimator verl 0.9.1 registers has a counterpart; what is left out of them is ``Covered.left_out``)
NOT_INCLUDED_LOSSES: dict[str, str] = {}
NOT_INCLUDED_ESTIMATORS: dict[str, str] = {}


def verl_policy_losses() -> set[str]:
    return {n for n, fn in core_algos.POLICY_LOSS_REGISTRY.items() if fn.__module__.startswith("verl.")}


def verl_estimators() -> set[str]:
    registered = {n for n, fn in core_algos.ADV_ESTIMATOR_REGISTRY.items() if fn.__module__.startswith("verl.")}
    return registered | {e.value for e in core_algos.AdvantageEstimator}


def not_included_text() -> str:
    """docs/objectives.md's blocks (paragraphs, list items) that say "not included", whitespace normalised."""
    blocks = re.split(r"\n\s*\n|\n\s*- ", DOCS.read_text())
    return " ".join(" ".join(b.split()) for b in blocks if "not included" in b.lower())


@pytest.mark.parametrize(("kind", "found", "covered", "left_out"), [
    ("policy loss", verl_policy_losses, POLICY_LOSSES, NOT_INCLUDED_LOSSES),
    ("advantage estimator", verl_estimators, ESTIMATORS, NOT_INCLUDED_ESTIMATORS),
])
def test_every_verl_entry_is_covered_or_not_included(kind, found, covered, left_out):
    check_complete(kind, found(), covered, left_out)


def check_complete(kind: str, names: set[str], covered: dict, left_out: dict) -> None:
    assert names, f"no verl {kind} found: verl's registry moved"
    assert not set(covered) & set(left_out), "a name is both covered and not included"
    missing = sorted(names - set(covered) - set(left_out))
    assert not missing, (f"verl registers {kind}(s) {missing} that no parity test covers and docs/objectives.md does "
                         f"not list as not included: add a parity test (and map it here) or a 'Not included' reason")
    stale = sorted((set(covered) | set(left_out)) - names)
    assert not stale, f"mapped verl {kind}(s) {stale} that verl no longer registers"


def test_a_loss_or_estimator_verl_adds_fails_the_check(monkeypatch):
    """What a verl upgrade that registers something new looks like: a function of verl's module in its registry."""
    def new_loss(*args, **kwargs):  # pragma: no cover - never called
        raise NotImplementedError

    new_loss.__module__ = core_algos.__name__
    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "new_loss", new_loss)
    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "new_estimator", new_loss)
    with pytest.raises(AssertionError, match="new_loss"):
        check_complete("policy loss", verl_policy_losses(), POLICY_LOSSES, NOT_INCLUDED_LOSSES)
    with pytest.raises(AssertionError, match="new_estimator"):
        check_complete("advantage estimator", verl_estimators(), ESTIMATORS, NOT_INCLUDED_ESTIMATORS)
    # pobench's own registrations in verl's registry (pobench_<name>, bench.engines.verl) are not verl's
    def pobench_loss(*args, **kwargs):  # pragma: no cover - never called
        raise NotImplementedError

    monkeypatch.delitem(core_algos.POLICY_LOSS_REGISTRY, "new_loss")
    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "pobench_x", pobench_loss)
    check_complete("policy loss", verl_policy_losses(), POLICY_LOSSES, NOT_INCLUDED_LOSSES)


def test_not_included_reasons_are_the_docs():
    text = not_included_text()
    for name, reason in {**NOT_INCLUDED_LOSSES, **NOT_INCLUDED_ESTIMATORS}.items():
        assert " ".join(reason.split()) in text, f"{name}: reason not in docs/objectives.md's 'Not included' text"
    for name, entry in {**POLICY_LOSSES, **ESTIMATORS}.items():
        for option in entry.left_out:
            assert f"`{option}`" in text, f"{name}: {option} left out, but docs' 'Not included' text does not say so"


def _names_in(path: Path) -> tuple[set[str], set[str], set[str]]:
    """(test functions, string constants, referenced names / attributes) of a Python file."""
    tree = ast.parse(path.read_text())
    funcs = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    refs = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    refs |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    refs |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    return funcs, strings, refs


@pytest.mark.parametrize(("registry", "mapping"), [("policy", POLICY_LOSSES), ("estimator", ESTIMATORS)])
def test_the_mapping_names_real_tests_of_that_verl_entry(registry, mapping):
    ours = set(list_objectives()) | set(estimator_names())
    verl = core_algos.POLICY_LOSS_REGISTRY if registry == "policy" else core_algos.ADV_ESTIMATOR_REGISTRY
    for name, entry in mapping.items():
        assert entry.tests, name
        assert set(entry.pobench) <= ours, f"{name}: {sorted(set(entry.pobench) - ours)} not registered in pobench"
        for node in entry.tests:
            path, func = node.split("::")
            funcs, strings, refs = _names_in(ROOT / path)
            assert func in funcs, f"{name}: {node} does not exist"
            if entry.via is not None:
                assert entry.via in refs and name in getattr(pobench_verl, entry.via).values(), (name, node)
            else:
                assert name in strings or verl[name].__name__ in refs, f"{name}: {path} never names it"


# ------------------------------------------------------------------------------------------------ vectorized
REWARDS = torch.tensor([[1.0, 0.0, 0.5, 0.2], [0.0, 0.0, 0.0, 1.0], [0.3, 0.9, 0.1, 0.0], [0.0, 0.7, 0.0, 0.4],
                        [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)  # the last group: all equal
LENGTHS = torch.tensor([[3, 7, 5, 2], [6, 1, 4, 7], [2, 2, 7, 5], [4, 3, 6, 1], [5, 5, 2, 7]])


def verl_vectorized(verl_name: str, rewards: torch.Tensor, lengths: torch.Tensor, **kw) -> tuple:
    P, G = rewards.shape
    mask = (torch.arange(7)[None, :] < lengths.flatten()[:, None]).double()
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(P * G), lengths.flatten() - 1] = rewards.flatten()
    their, _ = core_algos.get_adv_estimator_fn(verl_name)(
        token_level_rewards=token_rewards, response_mask=mask, index=np.repeat(np.arange(P), G),
        config=AlgoConfig(gamma=1.0), **kw)
    return their, mask


@pytest.mark.parametrize(("verl_name", "ours", "kw"), [
    ("grpo_vectorized", "group", {}),
    ("grpo_vectorized", "group-no-std", {"norm_adv_by_std_in_grpo": False}),
    ("rloo_vectorized", "rloo", {}),
])
def test_vectorized_estimator_matches_verl(verl_name, ours, kw):
    """Groups of 4, one of them all equal."""
    their, mask = verl_vectorized(verl_name, REWARDS, LENGTHS, **kw)
    our = group_advantages(REWARDS, ours, lengths=LENGTHS).flatten()
    # grpo_vectorized computes its group statistics in float32
    torch.testing.assert_close(our[:, None] * mask, their.double(), rtol=1e-5, atol=1e-6)


def test_groups_of_one_differ_as_documented():
    """Groups of one completion (docs/objectives.md, "Checks against verl"): verl's grpo and grpo_vectorized give R
    mean 0 and std 1, Â = R/(1 + 1e-6) (R without the std); pobench's ``group`` / ``group-no-std`` centre R on
    itself, as TRL: Â = 0. verl's rloo uses no baseline (Â = R, pobench's rloo too: test_verl_parity) but its
    rloo_vectorized gives 0: verl's two RLOOs disagree here, and pobench follows ``rloo``."""
    rewards, lengths = REWARDS[:, :1], LENGTHS[:, :1]
    r = rewards.flatten()[:, None]
    for verl_name, kw, theirs_expected in [("grpo", {}, r / (1 + 1e-6)), ("grpo_vectorized", {}, r / (1 + 1e-6)),
                                           ("grpo_vectorized", {"norm_adv_by_std_in_grpo": False}, r),
                                           ("rloo", {}, r), ("rloo_vectorized", {}, 0 * r)]:
        their, mask = verl_vectorized(verl_name, rewards, lengths, **kw)
        torch.testing.assert_close(their.double(), theirs_expected * mask, rtol=1e-6, atol=1e-7)
    for ours, expected in [("group", 0 * r), ("group-no-std", 0 * r), ("rloo", r)]:
        torch.testing.assert_close(group_advantages(rewards, ours, lengths=lengths)[:, :1], expected.view(-1, 1))
