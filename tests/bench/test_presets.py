"""Named configurations (bench/presets.py) and the positive controls in `bench run` (--preset, --controls): which
objectives and seeds a command runs, and in which order settings override each other. The shipped starting policy of
the `headroom` preset is the warm-start recipe's first 425 steps (docs/TESTBED.md)."""

from __future__ import annotations

import json

import pytest
import yaml
from mlflow import MlflowClient

from algorithms import list_controls
from bench.comparison import base_config
from bench.config import TrainConfig
from bench.model import BUILTIN_MODELS, load_policy
from bench.presets import PRESETS, get_preset
from bench.warmstart import fingerprint
from tests.conftest import fresh_store

from .fake_trainer import inject


def test_every_preset_is_a_valid_config_file_and_configs_holds_the_same_file():
    from pathlib import Path

    configs = Path(__file__).resolve().parents[2] / "configs"
    for p in PRESETS.values():
        data = yaml.safe_load(p.path.read_text())
        TrainConfig.from_dict(data).validate()
        assert (configs / p.path.name).read_text() == p.path.read_text()
        assert not set(p.seeds) & set(p.chosen_on)  # reported on seeds it was not chosen on


def test_unknown_preset_is_one_line_with_the_valid_names():
    with pytest.raises(ValueError, match="unknown preset 'headrom' \\(did you mean 'headroom'\\?\\); valid: headroom"):
        get_preset("headrom")


def test_settings_layer_bench_run_defaults_then_preset_then_config_then_flags(tmp_path):
    cfg_file = tmp_path / "mine.yaml"
    cfg_file.write_text("steps: 7\nlr: 2.0e-5\n")
    preset = get_preset("headroom")
    cfg = base_config(cfg_file, preset=preset.path, lr=1e-4)
    assert cfg.model == "builtin:tiny-arith-425"  # the preset's
    assert cfg.steps == 7  # --config over the preset's 40
    assert cfg.lr == 1e-4  # a flag over both
    assert cfg.checkpoint_every == 10 and cfg.eval_every == 5  # the preset over bench run's defaults (5, 2)


def _objectives_and_seeds(bench_here, folder, *argv):
    inject_args = ["--steps", "1", "--eval-every", "1", "--no-report", "--workers", "1", "--no-progress",
                   "--tracking-uri", fresh_store(folder), "--output-dir", str(folder / "runs")]
    rc, out, err = bench_here(["run", *argv, *inject_args], folder)
    assert rc == 0, err
    client = MlflowClient(tracking_uri=fresh_store(folder))
    exp = client.get_experiment_by_name("pobench")
    found = client.search_runs([exp.experiment_id], "tags.`pobench.kind` = 'train'")
    return ({r.data.tags["pobench.objective"] for r in found}, {int(r.data.tags["pobench.seed"]) for r in found},
            {r.data.tags["pobench.objective"]: r.data.tags.get("pobench.control_of") for r in found})


def test_a_preset_runs_its_objectives_on_its_seeds_with_the_controls(bench_here, monkeypatch, tmp_path):
    inject(monkeypatch.setattr)
    objectives, seeds, control_of = _objectives_and_seeds(bench_here, tmp_path, "--preset", "headroom")
    assert objectives == set(get_preset("headroom").algos) | set(list_controls())
    assert seeds == set(get_preset("headroom").seeds)
    assert control_of["ctrl-reversed"] == "grpo" and control_of["grpo"] is None  # the report reads this tag


@pytest.mark.parametrize("argv, with_controls", [
    (["--algos", "grpo"], False),                       # objectives named: controls only when asked
    (["--algos", "grpo", "--controls"], True),
    (["--seeds", "0", "--no-controls"], False),         # bench run's own objectives without them
])
def test_controls_join_when_asked_or_with_the_default_objectives(bench_here, monkeypatch, tmp_path, argv,
                                                                 with_controls):
    inject(monkeypatch.setattr)
    objectives, _, _ = _objectives_and_seeds(bench_here, tmp_path, *argv, "--seeds", "0")
    assert (set(list_controls()) <= objectives) is with_controls


def test_the_headroom_start_is_the_shipped_recipe_stopped_at_425_steps():
    """Its record is the same recipe but the step count, and its first 50 losses are the shipped run's to float
    rounding (the two were trained on different CPUs: rounding differences grow chaotically over hundreds of steps,
    which is why the weights are shipped rather than rebuilt; docs/TESTBED.md); the weights are those its record
    fingerprints."""
    early, shipped = (json.loads((BUILTIN_MODELS[m] / "warmstart.json").read_text())
                      for m in ("builtin:tiny-arith-425", "builtin:tiny-arith"))
    assert {**early["recipe"], "steps": 500} == shipped["recipe"] and early["recipe"]["steps"] == 425
    assert len(early["losses"]) == 425
    assert early["losses"][:50] == pytest.approx(shipped["losses"][:50], rel=1e-5, abs=0)
    model, _ = load_policy("builtin:tiny-arith-425")
    assert fingerprint(model) == early["fingerprints"]["425"]
