"""Objective state in the native loop (docs/ARCHITECTURE.md, "Objective state"), with TRL's adaptive entropy
coefficient: advanced after every optimizer step, logged each step, saved in each checkpoint and restored on a resume,
so a run stopped and resumed equals the uninterrupted one exactly (coefficient trajectory, every metric, the weights).
The engines that do not drive it refuse it before any work."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from bench.config import TrainConfig
from bench.engines.entry import check, train
from bench.model import load_policy
from bench.runs.checkpoint import CheckpointError
from reports import metric_keys as K
from tests.conftest import fresh_store

# H* = 0.3 nats with δ = 0.01 on the built-in model: α goes up, then down (0.03, 0.05, 0.07, 0.03 when written)
CONTROLLER = {"entropy_target": 0.3, "entropy_coef": 0.01, "entropy_coef_delta": 0.01}
COEF = "objective/entropy_coef"


def _cfg(tmp_path: Path, uri: str, name: str, **kw) -> TrainConfig:
    base = dict(algo="entropy_reg", steps=4, prompts_per_step=4, group_size=4, max_new_tokens=24, eval_every=0,
                checkpoint_every=1, samples_every=0, lr=1e-3, output_dir=str(tmp_path / name), tracking_uri=uri,
                experiment="test-objective-state", run_name=name, objective_overrides=dict(CONTROLLER))
    base.update(kw)
    return TrainConfig(**base)


def _history(run_id: str, uri: str) -> dict[str, list[tuple[int, float]]]:
    c = MlflowClient(uri)
    return {k: sorted((m.step, m.value) for m in c.get_metric_history(run_id, k))
            for k in c.get_run(run_id).data.metrics if not k.startswith(K.TIMING_PREFIXES)}


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return fresh_store(tmp_path_factory.mktemp("mlflow"))


@pytest.mark.slow
def test_a_resumed_run_equals_the_uninterrupted_one_with_its_controller(tmp_path, uri):
    straight = train(_cfg(tmp_path, uri, "straight"))

    def stop_at_3(step, _metrics):
        if step == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(tmp_path, uri, "resumed"), on_step=stop_at_3)
    run_dir = _cfg(tmp_path, uri, "resumed").run_dir()
    saved = json.loads((run_dir / "ckpt-0000002" / "state.json").read_text())["objective_state"]
    assert set(saved) == {"entropy_coef", "entropy"} and math.isfinite(saved["entropy"])
    resumed = train(_cfg(tmp_path, uri, "resumed", resume=True))  # from step 2: steps 3 and 4 again

    h_str, h_res = _history(straight.run_id, uri), _history(resumed.run_id, uri)
    coef = [v for _, v in h_str[COEF]]
    assert [s for s, _ in h_str[COEF]] == [1, 2, 3, 4]
    assert len(set(coef)) > 2 and coef != sorted(coef)  # the controller moved both ways
    assert saved["entropy_coef"] == coef[1]  # the checkpoint of step 2 holds α after step 2
    assert set(h_res) == set(h_str)
    for k, values in h_str.items():
        assert h_res[k] == values, k  # identical, not close: the coefficient trajectory and every other metric
    a, _ = load_policy(str(Path(straight.output_dir) / "final"))
    b, _ = load_policy(str(Path(resumed.output_dir) / "final"))
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n


@pytest.mark.slow
def test_the_coefficient_moves_once_per_optimizer_step(tmp_path, uri):
    """H* far above the model's entropy: α rises by δ after each of the minibatches x update_epochs optimizer steps
    of a step, up to α_max; the loss applies the α of the previous optimizer step (none in the first)."""
    over = {"entropy_target": 50.0, "entropy_coef": 0.0, "entropy_coef_delta": 0.01, "entropy_coef_max": 0.1}
    res = train(_cfg(tmp_path, uri, "rising", steps=3, minibatches=2, update_epochs=2, objective_overrides=over))
    h = _history(res.run_id, uri)
    assert [v for _, v in h[COEF]] == pytest.approx([0.04, 0.08, 0.1], abs=1e-12)  # 4 optimizer steps per step
    # applied, mean over the step's micro-batches (weighted by sequences): step 1: 0, .01, .02, .03; step 2: .04 .. .07
    applied = [v for _, v in h["objective/entropy_coef_applied"]]
    assert applied == pytest.approx([0.015, 0.055, (0.08 + 0.09 + 0.1 + 0.1) / 4], abs=1e-7)  # (float32)


def test_a_checkpoint_with_another_objective_state_is_refused(tmp_path, uri):
    cfg = _cfg(tmp_path, uri, "other", steps=1)
    train(cfg)
    state_json = cfg.run_dir() / "ckpt-0000001" / "state.json"
    state = json.loads(state_json.read_text())
    state["objective_state"] = {"entropy_coef": 0.5}
    state_json.write_text(json.dumps(state))  # (a state.json edited by hand: its own digest is not recorded)
    with pytest.raises(CheckpointError, match="not this objective's"):
        train(_cfg(tmp_path, uri, "other", steps=2, resume=True))


@pytest.mark.parametrize("engine", ["trl", "verl"])
def test_engines_that_do_not_drive_objective_state_refuse_it_before_any_work(engine):
    cfg = TrainConfig(algo="entropy_reg", engine=engine, objective_overrides=dict(CONTROLLER))
    with pytest.raises(ValueError, match="state"):
        check(cfg)
    check(TrainConfig(algo="entropy_reg", objective_overrides=dict(CONTROLLER)))  # the native loop runs it
