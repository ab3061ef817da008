"""Registry behaviour, config validation, CLI listing and the docs/objectives.md defaults."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import algorithms
from algorithms import default_config, get_objective, get_spec, list_objectives, register, search_space, unregister
from algorithms.describe import defaults_markdown
from algorithms.policy_gradient import ClippedPG
from bench.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_duplicate_name_raises():
    with pytest.raises(ValueError, match="already registered"):
        register("grpo", ClippedPG, description="again")


def test_unknown_name_lists_valid_and_suggests():
    with pytest.raises(ValueError, match=r"did you mean 'dapo'.*registered: grpo"):
        get_objective("dapoo")


def test_unknown_field_lists_valid_and_suggests():
    with pytest.raises(ValueError, match=r"did you mean 'kl_coef'.*valid fields:.*entropy_threshold"):
        get_objective("tepo", kl_coeff=0.1)


@pytest.mark.parametrize("name,field,value", [
    ("tepo", "kl_coef", -0.1), ("grpo", "clip_low", 0.0), ("dapo", "clip_high", 1.0), ("tepo", "clip_low", 1.2),
    ("clip_cov", "clip_cov_frac", 1.5), ("kl_cov", "kl_cov_frac", -0.1), ("forking_tokens", "forking_frac", 2.0),
    ("grpo", "kl_estimator", "k4"), ("tepo", "aggregation", "sum"), ("grpo", "advantage_estimator", "loo"),
    ("tepo", "kl_coef", float("nan")), ("dapo", "overlong_buffer_frac", 1.0),
])
def test_invalid_values_raise_with_field_name(name, field, value):
    with pytest.raises(ValueError, match=field):
        get_objective(name, **{field: value})


def test_configs_are_frozen_and_documented():
    for name in list_objectives():
        cfg = default_config(name)
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.aggregation = "token-mean"
        for f in dataclasses.fields(cfg):
            assert f.metadata.get("doc"), f"{name}.{f.name} has no doc"


def test_ablations_are_base_plus_one_field():
    base = dataclasses.asdict(default_config("tepo"))
    for name in list_objectives():
        if get_spec(name).base == "tepo":
            diff = {k for k, v in dataclasses.asdict(default_config(name)).items() if base[k] != v}
            if name == "tepo-token-ratio":  # a token ratio comes with the token-level clip range (0.2 / 0.28)
                assert diff == {"ratio", "clip_low", "clip_high"}, diff
            else:
                assert len(diff) == 1, (name, diff)


# the objectives the suite exists to compare and the paper each cites (docs/objectives.md, "The objectives")
PAPERS = {"grpo": "arXiv 2402.03300", "dr_grpo": "arXiv 2503.20783", "dapo": "arXiv 2503.14476",
          "gspo": "arXiv 2507.18071", "entropy_reg": "PPO-style entropy bonus", "clip_cov": "arXiv 2505.22617",
          "kl_cov": "arXiv 2505.22617", "forking_tokens": "arXiv 2506.01939", "tepo": "arXiv 2604.12736"}
TEPO_ABLATIONS = {"tepo-no-mask", "tepo-mask-all", "tepo-mask-adv", "tepo-mask-entropy", "tepo-token-ratio",
                  "tepo-seq-mean", "tepo-likelihood-credit", "tepo-kl-old", "tepo-entropy-old"}


def test_compared_objectives_registered_with_their_papers():
    for name, paper in PAPERS.items():
        assert get_spec(name).paper == paper and get_spec(name).base is None, name
    assert {n for n in list_objectives() if get_spec(n).base == "tepo"} == TEPO_ABLATIONS


def test_every_registered_objective_is_described_in_the_docs():
    # outside the generated defaults block: a formula or an ablation's meaning written for readers
    prose = (ROOT / "docs" / "objectives.md").read_text().split("<!-- defaults:start -->", 1)[0]
    for name in list_objectives():
        assert f"`{name}`" in prose, f"docs/objectives.md does not describe {name!r}"


def test_ablation_registration_and_unregister():
    register("tepo-test-beta", base="tepo", description="test", kl_coef=0.2)
    try:
        assert get_objective("tepo-test-beta").config.kl_coef == 0.2
        assert "tepo-test-beta" in algorithms.objective_groups()["tepo"]
        with pytest.raises(ValueError, match="no config field"):
            register("tepo-bad", base="tepo", description="bad", nope=1)
    finally:
        unregister("tepo-test-beta")
    assert "tepo-test-beta" not in list_objectives()


def test_search_spaces_declared_and_contain_defaults():
    tepo = search_space("tepo")
    assert set(tepo) == {"kl_coef", "adv_threshold", "entropy_threshold", "clip_low", "clip_high"}
    assert "entropy_coef" in search_space("entropy_reg")
    assert "clip_cov_frac" in search_space("clip_cov") and "kl_cov_frac" in search_space("kl_cov")
    assert "kl_coef" not in search_space("tepo-no-mask")  # switched-off terms are not searched by default
    for name in list_objectives():
        cfg = default_config(name)
        for field, (lo, hi, _log) in search_space(name).items():
            assert lo < hi and lo <= getattr(cfg, field) <= hi, (name, field)


def test_resolve_names_groups():
    names = algorithms.resolve_names("grpo,@tepo")
    assert names[:2] == ["grpo", "tepo"] and set(names[2:]) == TEPO_ABLATIONS and len(names) == 11
    with pytest.raises(ValueError, match="unknown objective group"):
        algorithms.resolve_names("@grpo")


def test_bench_list_shows_every_objective(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in list_objectives():
        assert re.search(rf"^{re.escape(name)}\s", out, re.M), name


def test_bench_list_details(capsys):
    assert main(["list", "--details", "dapo"]) == 0
    out = capsys.readouterr().out
    assert "arXiv 2503.14476" in out and "clip_high" in out and "0.28" in out
    assert main(["list", "--details", "dapoo"]) == 2
    assert "did you mean 'dapo'" in capsys.readouterr().err


def test_docs_defaults_match_code():
    text = (ROOT / "docs" / "objectives.md").read_text()
    block = text.split("<!-- defaults:start -->\n", 1)[1].split("<!-- defaults:end -->", 1)[0]
    assert block == defaults_markdown(), "docs/objectives.md is stale: regenerate with `bench list --markdown`"
