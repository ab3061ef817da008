"""TRL's adaptive entropy coefficient (``entropy_target`` > 0 on any PolicyGradient objective): the controller's update
and gate by hand, in plain Python arithmetic from docs/objectives.md ("Adaptive entropy coefficient"), and the
objective state it lives in (``Objective.initial_state`` / ``state_sums`` / ``next_state`` / ``restore_state``).

The rule (TRL 1.16 ``GRPOTrainer._compute_loss``): after each optimizer step H = Σ m·H_θ / max(Σ m, 1) over all the
micro-batches of that step; α ← min(α + δ, α_max) if H <= H*, else max(α − δ, α_min); the loss applies −α·H_θ only
while the H of the previous optimizer step was <= H* (none before the first).
"""

from __future__ import annotations

import math

import pytest
import torch

from algorithms import PolicyBatch, get_objective

# one optimizer step of two micro-batches of different token counts (padding holds 9.0: it must not count)
#   micro-batch 1: 6 tokens of H_θ = 0.1 (sum 0.6); micro-batch 2: 1 token of H_θ = 1.5
#   the step's H = (0.6 + 1.5) / 7 = 0.3 <= H* = 0.5: α goes up.
#   Wrong readings go down: the last micro-batch alone 1.5, the mean of the micro-batch means (0.1 + 1.5) / 2 = 0.8,
#   H_old (2.0 everywhere), the padding counted (0.6 + 1.5 + 9.0) / 8 = 1.3875.
MB1 = dict(ent=[[0.1, 0.1, 0.1, 0.1], [0.1, 0.1, 9.0, 9.0]], mask=[[1, 1, 1, 1], [1, 1, 0, 0]])
MB2 = dict(ent=[[1.5, 9.0, 9.0, 9.0]], mask=[[1, 0, 0, 0]])
TARGET, DELTA = 0.5, 0.005


def mb(ent, mask, adv=None, old_entropy=2.0, lp=-1.0) -> PolicyBatch:
    B, T = len(ent), len(ent[0])
    return PolicyBatch(logprobs=torch.full((B, T), lp, dtype=torch.float64, requires_grad=True),
                       old_logprobs=torch.full((B, T), lp, dtype=torch.float64),
                       advantages=torch.tensor(adv or [1.0] * B, dtype=torch.float64),
                       mask=torch.tensor(mask, dtype=torch.float64), max_length=T,
                       entropy=torch.tensor(ent, dtype=torch.float64, requires_grad=True),
                       old_entropy=torch.full((B, T), old_entropy, dtype=torch.float64))


def controller(**kw):
    return get_objective("entropy_reg", entropy_target=TARGET, entropy_coef_delta=DELTA, **kw)


def one_step(obj, *batches) -> dict[str, float]:
    """What the native loop does around one optimizer step: add up state_sums, then next_state."""
    sums: dict[str, float] = {}
    for b in batches:
        for k, v in obj.state_sums(b).items():
            sums[k] = sums.get(k, 0.0) + float(v)
    obj.state = obj.next_state(obj.state, sums)
    return obj.state


def test_initial_state_is_the_initial_coefficient_and_no_measurement():
    obj = controller(entropy_coef=0.01)
    assert obj.state == {"entropy_coef": 0.01, "entropy": math.inf}
    assert get_objective("entropy_reg").state == {}  # the fixed α: no state, nothing for the loop to carry
    assert get_objective("grpo").initial_state() == {}


def test_update_uses_the_token_weighted_entropy_of_the_whole_optimizer_step():
    obj = controller(entropy_coef=0.01)
    state = one_step(obj, mb(**MB1), mb(**MB2))
    assert state["entropy"] == pytest.approx(2.1 / 7, abs=1e-15)  # 0.3: not 1.5, 0.8, 2.0 nor 1.3875
    assert state["entropy_coef"] == pytest.approx(0.01 + DELTA, abs=1e-15)  # 0.3 <= 0.5: up by δ


def test_entropy_above_target_lowers_the_coefficient():
    obj = controller(entropy_coef=0.01)
    state = one_step(obj, mb(ent=[[0.6, 0.8]], mask=[[1, 1]]))  # H = 0.7 > 0.5
    assert state == pytest.approx({"entropy_coef": 0.01 - DELTA, "entropy": 0.7}, abs=1e-15)


def test_entropy_equal_to_the_target_raises_it():
    obj = controller(entropy_coef=0.01)
    state = one_step(obj, mb(ent=[[0.5, 0.5]], mask=[[1, 1]]))  # H = 0.5 = H*: TRL's "<=" (not "<")
    assert state["entropy_coef"] == pytest.approx(0.015, abs=1e-15)


def test_coefficient_is_clamped_to_its_bounds():
    obj = controller(entropy_coef=0.01, entropy_coef_min=0.007, entropy_coef_max=0.018)
    low, high = mb(ent=[[0.2]], mask=[[1]]), mb(ent=[[0.9]], mask=[[1]])
    trajectory = [one_step(obj, b)["entropy_coef"] for b in (low, low, low, high, high, high)]
    # 0.01 -> 0.015 -> 0.018 (not 0.020) -> 0.018 -> 0.013 -> 0.008 -> 0.007 (not 0.003)
    assert trajectory == pytest.approx([0.015, 0.018, 0.018, 0.013, 0.008, 0.007], abs=1e-15)


def test_mask_truncated_leaves_truncated_completions_out_of_the_measurement():
    obj = controller(entropy_coef=0.01, mask_truncated=True)
    b = mb(ent=[[0.2, 0.2], [1.9, 1.9]], mask=[[1, 1], [1, 1]])
    b.truncated = torch.tensor([False, True])
    state = one_step(obj, b)  # only the first completion: H = 0.2 (with the truncated one: 1.05 > H*)
    assert state == pytest.approx({"entropy_coef": 0.015, "entropy": 0.2}, abs=1e-15)


# --- the gate and the loss: −α·H_θ aggregated as the fixed bonus (entropy_reg: seq-mean-token-mean)
def bonus(ent, mask) -> float:
    per_seq = [sum(h for h, m in zip(e, k) if m) / sum(k) for e, k in zip(ent, mask)]
    return sum(per_seq) / len(per_seq)


@pytest.mark.parametrize(("last", "applied"), [(math.inf, 0.0), (0.6, 0.0), (0.5, 0.02), (0.3, 0.02)])
def test_the_loss_applies_alpha_only_while_the_last_measured_entropy_is_at_most_the_target(last, applied):
    obj = controller(entropy_coef=0.01)
    obj.state = {"entropy_coef": 0.02, "entropy": last}
    b = mb(**MB1, adv=[1.0, -1.0])
    loss, m = obj.loss(b)
    plain = m["objective/policy_loss"].item()
    assert loss.item() == pytest.approx(plain - applied * bonus(MB1["ent"], MB1["mask"]), abs=1e-12)
    assert m["objective/entropy_coef_applied"].item() == applied
    # the gate reads the state, not this batch's entropy (0.1 and 0.1: below H* whatever the state)
    g = torch.autograd.grad(loss, b.entropy, allow_unused=True)[0]
    assert (g is not None and g.abs().sum() > 0) == (applied > 0)


def test_state_metrics_and_restore():
    obj = controller(entropy_coef=0.01)
    one_step(obj, mb(ent=[[0.2]], mask=[[1]]))
    assert obj.state_metrics() == {"objective/entropy_coef": pytest.approx(0.015, abs=1e-15)}
    fresh = controller(entropy_coef=0.01)
    fresh.restore_state(dict(obj.state))
    assert fresh.state == obj.state
    with pytest.raises(ValueError, match="not this objective's"):
        fresh.restore_state({"entropy_coef": 0.1})
    with pytest.raises(ValueError, match="not this objective's"):
        get_objective("grpo").restore_state({"entropy_coef": 0.1, "entropy": 0.2})
    get_objective("grpo").restore_state(None)  # a checkpoint of a stateless objective (or an older one)


def test_declarations():
    obj = controller(entropy_coef=0.0)
    assert obj.needs_entropy_grad  # α may act from the next optimizer step on
    assert any("adaptive entropy bonus" in t for t in obj.zero_advantage_terms())
    with pytest.raises(ValueError, match="entropy_coef_max"):
        controller(entropy_coef_min=0.5, entropy_coef_max=0.1)
    with pytest.raises(ValueError, match="entropy_target"):
        get_objective("grpo", entropy_target=-0.1)


def test_the_probe_sees_the_controller_with_its_gate_open():
    """The distinguishability probe evaluates a stateful objective where its state acts (probe_state): grpo with the
    adaptive coefficient differs from grpo (it coincided at the initial state, gate closed), and its gradient has the
    entropy term of α = α_0 + δ."""
    from algorithms.probe import Regime, gradient, make_batch, relative_difference

    pb = make_batch(Regime(updates_before=3))
    plain, _ = gradient("grpo", {"kl_coef": 0.0}, [pb])
    adaptive, _ = gradient("grpo", {"kl_coef": 0.0, "entropy_target": 0.5, "entropy_coef": 0.01}, [pb])
    fixed, _ = gradient("grpo", {"kl_coef": 0.0, "entropy_coef": 0.015}, [pb])  # α_0 + δ (0.005), applied
    assert relative_difference(plain, adaptive) > 1e-3
    torch.testing.assert_close(adaptive, fixed)
