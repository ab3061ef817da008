"""The positive controls: GRPO with its credit broken on purpose (algorithms/advantages.py, algorithms/__init__.py)."""

from __future__ import annotations

import pytest
import torch

from algorithms import get_objective, get_spec, group_advantages, list_controls, register, unregister
from algorithms.advantages import CONTROL_ESTIMATORS


def test_every_registered_control_names_a_registered_base_and_uses_a_control_estimator():
    assert set(list_controls()) >= {"ctrl-reversed", "ctrl-shuffled"}
    for name in list_controls():
        spec = get_spec(name)
        get_spec(spec.control_of)  # registered
        assert get_objective(name).config.advantage_estimator in CONTROL_ESTIMATORS
        assert "worse than" in spec.description


def test_a_control_of_an_unregistered_objective_is_refused():
    with pytest.raises(ValueError, match="unknown objective 'nope'"):
        register("ctrl-bad", get_spec("grpo").objective_class, description="x", control_of="nope")
    unregister("ctrl-bad")


def test_reversed_is_the_negated_group_advantage():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0, 0.0]])
    assert torch.equal(group_advantages(r, "group-reversed"), -group_advantages(r, "group"))


def test_rolled_gives_each_completion_the_next_completions_advantage_within_its_own_group():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    z = group_advantages(r, "group")
    rolled = group_advantages(r, "group-rolled")
    for p in range(3):
        for i in range(4):
            assert rolled[p, i] == z[p, (i + 1) % 4]  # cyclic, never from another prompt's group
    assert torch.equal(rolled[2], torch.zeros(4))  # all-equal rewards: no credit at all, as GRPO
    assert not torch.equal(rolled, z)


@pytest.mark.parametrize("G", [4, 8, 16])
def test_the_expected_update_of_each_control_points_against_the_reward(G):
    """Σ_i r_i Â_i is the reward-term direction of a completion's update (the policy gradient weights ∇log π(y_i) by
    Â_i, so its component along the reward is Σ r_i Â_i): positive for GRPO; negative for the reversed control; for
    the rolled control −1/(G−1) of GRPO's on average (the own reward reaches Â_{i+1} only through the group mean),
    as the description says."""
    g = torch.Generator().manual_seed(0)
    r = (torch.rand(20_000, G, generator=g) < 0.4).float()  # (P, G) binary rewards

    def along(est: str) -> float:
        return float((r * group_advantages(r, est)).sum(1).mean())

    grpo, rev, rolled = along("group"), along("group-reversed"), along("group-rolled")
    assert grpo > 0
    assert rev == pytest.approx(-grpo, rel=1e-6)
    assert rolled / grpo == pytest.approx(-1 / (G - 1), rel=0.05)
