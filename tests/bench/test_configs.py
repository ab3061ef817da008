"""Every paper recipe in configs/ loads as `bench run --config` reads it and validates for every objective it names
(no GPU, no download); every setting states its source."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from bench.comparison.plan import base_config, load_params, resolve_algos
from bench.config import TrainConfig
from bench.model import format_prompt

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
# the GPU recipes (a preset's link, configs/headroom.yaml, is checked in tests/bench/test_presets.py)
RECIPES = [p for p in CONFIGS if not p.name.endswith("-params.yaml") and not p.is_symlink()]


def test_there_are_recipes():
    names = {p.name for p in RECIPES}
    assert {"dapo-qwen2.5-math-1.5b.yaml", "compare-qwen2.5-math-1.5b.yaml", "compare-qwen2.5-math-7b.yaml"} <= names


def _run_line(path: Path) -> str:
    line = next(ln for ln in path.read_text().splitlines() if "bench run --config" in ln)
    assert f"configs/{path.name}" in line, f"{path.name}: its run command names another file"
    return line


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_validates_for_every_objective_of_its_run_command(path):
    data = yaml.safe_load(path.read_text())
    # `bench run` takes objective fields from --params: such keys here would be silently dropped
    assert "objective_overrides" not in data and "algo" not in data and "seed" not in data
    cfg = base_config(path)
    assert cfg.model.startswith("Qwen/Qwen2.5-Math-") and cfg.device == "cuda" and cfg.dtype == "bfloat16"
    line = _run_line(path)
    algos = resolve_algos(re.search(r"--algos (\S+)", line).group(1))
    params_file = re.search(r"--params (\S+)", line)
    params = load_params(path.parent.parent / params_file.group(1) if params_file else None, algos)
    for a in algos:
        dataclasses.replace(cfg, algo=a, objective_overrides=params[a]).validate()
    # the prompt template is a format string with {question}
    assert format_prompt(None, "1+1?", cfg.prompt_template).count("1+1?") == 1
    # the held-out problems fit the model's 4,096-token context with room for the prompt
    assert cfg.max_new_tokens <= 4096 - 512


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_setting_cites_its_source_or_is_marked_as_ours(path):
    lines = path.read_text().splitlines()
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for i, ln in enumerate(lines):
        m = re.match(r"^([a-z_]+):", ln)
        if not m:
            continue
        assert m.group(1) in fields, ln
        if m.group(1) in ("device", "model"):  # what is run, not a setting of a recipe
            continue
        comment = ln.split("#", 1)[1] if " #" in ln else (lines[i - 1] if lines[i - 1].startswith("#") else "")
        assert re.search(r"\[(ours|paper|verl|grpo|dapo)[\],:]|Hendrycks|all ", comment), f"{path.name}: {ln}"
