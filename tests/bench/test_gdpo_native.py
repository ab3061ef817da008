"""GDPO on the native loop: ``advantage_inputs`` hands the estimator the reward's components in ``REWARD_COMPONENTS``
order (the outcome, the answer format read from the text, DAPO's overlong penalty as shaped − outcome; under the
random-reward control the format is a coin flip too), ``collect_rollouts``' groups carry the unshaped outcome, TRL and
verl refuse it before any work, and two native steps train."""

from __future__ import annotations

import pytest
import torch

from algorithms import get_objective
from algorithms.advantages import REWARD_COMPONENTS
from bench.config import TrainConfig
from bench.engines.entry import check
from bench.engines.native.step import Group, advantage_inputs

TEXTS = [["1 + 2 = 3\n#### 3", "the answer is 3", "\\boxed{4}", ""], ["#### 7", "#### 8", "7", "#### Notes\n7"]]
OUTCOMES = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0]])
PENALTY = torch.tensor([[0.0, -0.25, 0.0, -1.0], [0.0, 0.0, -0.5, 0.0]])


def groups():
    """Two groups whose verifier outcome (``correct``) is not the reward's outcome, as under the random-reward
    control: the component is the reward's."""
    return [Group(f"q{p}", [1, 2], [[3] * (2 + i) for i in range(4)], TEXTS[p], OUTCOMES[p] + PENALTY[p],
                  1.0 - OUTCOMES[p], outcomes=OUTCOMES[p]) for p in range(2)]


def test_advantage_inputs_hand_gdpo_its_components_in_order():
    cfg = TrainConfig(algo="gdpo")
    out = advantage_inputs(cfg, get_objective("gdpo"), None, None, None, groups(), step=0)
    assert set(out) == {"lengths", "reward_components"} and REWARD_COMPONENTS == ("correct", "format", "overlong")
    comps = out["reward_components"]  # (P, G, 3)
    torch.testing.assert_close(comps[..., 0], OUTCOMES)
    torch.testing.assert_close(comps[..., 1], torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]))
    torch.testing.assert_close(comps[..., 2], PENALTY)
    assert out["lengths"].tolist() == [[2, 3, 4, 5]] * 2


def test_under_the_random_reward_control_the_format_is_a_coin_flip():
    cfg = TrainConfig(algo="gdpo", control="random-reward")
    a = advantage_inputs(cfg, get_objective("gdpo"), None, None, None, groups(), step=0)["reward_components"]
    b = advantage_inputs(cfg, get_objective("gdpo"), None, None, None, groups(), step=0)["reward_components"]
    torch.testing.assert_close(a, b)  # seeded by the run and the step
    real = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    draws = [advantage_inputs(cfg, get_objective("gdpo"), None, None, None, groups(), step=s)["reward_components"]
             for s in range(6)]
    assert any(not torch.equal(d[..., 1], real) for d in draws)
    assert all(set(d[..., 1].flatten().tolist()) <= {0.0, 1.0} for d in draws)


def test_other_estimators_get_no_components():
    out = advantage_inputs(TrainConfig(), get_objective("grpo"), None, None, None, groups(), step=0)
    assert out == {}


@pytest.mark.parametrize("engine,why", [("trl", "reward_components"), ("verl", "reward's components")])
def test_trl_and_verl_refuse_gdpo_before_any_work(tmp_path, engine, why):
    cfg = TrainConfig(algo="gdpo", engine=engine, output_dir=str(tmp_path), tracking_uri=f"sqlite:///{tmp_path}/m.db")
    with pytest.raises(ValueError, match=why):
        check(cfg)
    assert not any(tmp_path.iterdir())


def test_a_short_native_run_trains_gdpo(tmp_path, monkeypatch):
    """Two steps of the native loop end to end; the components the estimator got are the rollout's own."""
    import bench.engines.native.step as step
    from bench.engines.entry import train
    from tests.conftest import fresh_store

    seen = []
    real = step.advantage_inputs

    def spy(cfg, objective, sampler, tok, data, kept, step_):
        out = real(cfg, objective, sampler, tok, data, kept, step_)
        seen.append((out["reward_components"], torch.stack([g.outcomes for g in kept]),
                     torch.stack([g.rewards for g in kept])))
        return out

    monkeypatch.setattr(step, "advantage_inputs", spy)
    cfg = TrainConfig(algo="gdpo", steps=2, prompts_per_step=4, group_size=4, max_new_tokens=16, eval_every=0,
                      checkpoint_every=0, samples_every=1, output_dir=str(tmp_path / "run"),
                      tracking_uri=fresh_store(tmp_path / "mlflow"), experiment="test-gdpo", run_name="gdpo",
                      objective_overrides={"overlong_shaping": True})
    assert train(cfg).steps_done == 2
    assert len(seen) == 2
    for comps, outcome, shaped in seen:
        torch.testing.assert_close(comps[..., 0], outcome)
        torch.testing.assert_close(comps[..., 0] + comps[..., 2], shaped)
