"""The report's positive-controls section (reports/controls.py) and the seed paper's claims (reports/claims.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from mlflow import MlflowClient

from reports import claims, stats
from reports.claims import CONTRADICTED, SUPPORTED, UNRESOLVED, claim_verdicts, seeds_needed
from reports.controls import DETECTED, MISSED, UNTESTABLE, WRONG, control_bases, control_results, controls_note
from reports.derived import ENTROPY_WINDOW, RunDerived, relative_change
from reports.load import RunData, load_comparison
from reports.record import CONTROL_OF, get_or_create_experiment
from reports.report import analyse
from reports.tables import Units


# ------------------------------------------------------------------ controls
def _finals(**per_objective):
    return {o: dict(enumerate(v)) for o, v in per_objective.items()}


def test_a_control_clearly_below_its_base_is_detected_with_its_effect_size():
    f = _finals(grpo=[0.40, 0.42, 0.38, 0.41, 0.39], **{"ctrl-a": [0.20, 0.25, 0.19, 0.22, 0.18]})
    (r,) = control_results(f, {"ctrl-a": "grpo"}, "grpo")
    assert r.verdict == DETECTED and r.reference == "grpo" and r.reference_is_base and r.n == 5
    diffs = np.array([f["ctrl-a"][s] - f["grpo"][s] for s in range(5)])
    assert r.diff == pytest.approx(diffs.mean())
    assert r.d_z == pytest.approx(diffs.mean() / diffs.std(ddof=1))
    assert r.half_width == pytest.approx(stats.mean_ci(diffs)[1])


def test_a_control_above_its_base_is_the_wrong_direction_and_noise_is_not_detected():
    f = _finals(grpo=[0.40, 0.42, 0.38, 0.41, 0.39], up=[0.60, 0.63, 0.57, 0.62, 0.58],
                flat=[0.41, 0.40, 0.39, 0.43, 0.38])
    res = {r.control: r for r in control_results(f, {"up": "grpo", "flat": "grpo"}, "grpo")}
    assert res["up"].verdict == WRONG
    assert res["flat"].verdict == MISSED


def test_holm_is_over_the_controls_only_and_a_missing_base_falls_back_to_the_baseline():
    f = _finals(dapo=[0.40, 0.42, 0.38, 0.41], a=[0.30, 0.35, 0.33, 0.36], b=[0.10, 0.12, 0.09, 0.11])
    res = control_results(f, {"a": "grpo", "b": "grpo"}, "dapo")
    assert all(r.reference == "dapo" and not r.reference_is_base for r in res)
    raw = [r.p for r in res]
    assert [r.p_holm for r in res] == pytest.approx(stats.holm(raw))
    assert min(r.p_holm for r in res) == pytest.approx(2 * min(raw))  # two tests in the family, not more


def test_a_control_with_one_common_seed_is_not_testable():
    (r,) = control_results(_finals(grpo=[0.4], c=[0.1]), {"c": "grpo"}, "grpo")
    assert r.verdict == UNTESTABLE


def test_the_note_says_first_when_a_control_was_not_detected():
    units = Units()
    assert "No positive control" in controls_note([], units)
    f = _finals(grpo=[0.40, 0.42, 0.38, 0.41, 0.39], good=[0.20, 0.25, 0.19, 0.22, 0.18],
                flat=[0.41, 0.40, 0.39, 0.43, 0.38])
    res = control_results(f, {"good": "grpo", "flat": "grpo"}, "grpo")
    note = controls_note(res, units)
    assert note.startswith("**This comparison did not detect") and "flat" in note and "not detected" in note
    all_found = controls_note([r for r in res if r.control == "good"], units)
    assert "detected every control" in all_found and "good (−19.2 points vs grpo" in all_found
    assert "find a loss of 19.2 points" in all_found


def _run(objective, seed, variant=None, tags=None):
    return RunData("id", f"{objective}-s{seed}", variant or objective, objective, seed, "FINISHED", "h", 0,
                   tags or {}, {})


def test_controls_are_known_by_their_tag_else_the_registry_and_not_with_overrides():
    runs = [_run("grpo", 0), _run("mine", 0, tags={CONTROL_OF: "dapo"}), _run("ctrl-reversed", 0),
            _run("ctrl-shuffled", 0, variant="ctrl-shuffled+abc123"), _run("not-registered", 0)]
    assert control_bases(runs) == {"mine": "dapo", "ctrl-reversed": "grpo"}


def test_a_report_keeps_its_controls_out_of_the_ranking_and_opens_with_them(handmade, local_uri):
    client = MlflowClient(tracking_uri=local_uri)
    exp_id = get_or_create_experiment(client, local_uri, "with-controls")
    for o in ("grpo", "tepo", "ctrl-reversed"):
        for s in (0, 1, 2):
            series = handmade.series(o, s)
            if o == "ctrl-reversed":  # falls from its start, as reward descent does
                series["eval/accuracy"] = [(st, max(0.0, 0.2 - 0.008 * st + 0.002 * s))
                                           for st, _ in series["eval/accuracy"]]
            handmade.log_run(client, exp_id, o, s, "c1", series=series)
    a = analyse(load_comparison("with-controls", tracking_uri=local_uri))
    assert a.notes[0].startswith("Positive controls: this comparison detected every control: ctrl-reversed")
    assert [r["objective"] for r in a.paired] == ["tepo"]  # the controls' tests are their own family
    assert a.tables["controls"].rows[0][-1] == DETECTED
    assert "ctrl-reversed" in [row[0] for row in a.tables["accuracy"].rows]  # still shown with the others


# ------------------------------------------------------------------ claims
def _derived(final, drawdown=0.0, entropy=None):
    """A run's derived numbers; ``entropy``: its entropy series, whose relative change derive() would store."""
    none = {f.name: None for f in dataclasses.fields(RunDerived) if f.name != "spike_at"}
    change = None if entropy is None else relative_change(entropy, ENTROPY_WINDOW)
    return RunDerived(**{**none, "initial_acc": 0.3, "final_acc": final, "best_acc": final, "acc_drawdown": drawdown,
                         "entropy_change": change})


def _entropy(start, change, steps=20):
    return [(s, start * (1 + change * s / steps)) for s in range(1, steps + 1)]


def _case(tepo_final, tepo_dd, tepo_ent, tepo_ttc, seeds=6, noise=0.004):
    rng = np.random.default_rng(0)
    groups, ttc = {}, {}
    for o in ("tepo", "grpo"):
        groups[o], ttc[o] = [], {}
        for s in range(seeds):
            e = rng.normal(0, noise)
            if o == "tepo":
                groups[o].append((s, _derived(tepo_final + e, tepo_dd + e, _entropy(1.0, tepo_ent + e))))
                ttc[o][s] = tepo_ttc * (1 + e)
            else:
                groups[o].append((s, _derived(0.5 + e, 0.05 + e, _entropy(1.0, -0.5 + e))))
                ttc[o][s] = 20.0 * (1 + 2 * e)
    return {(v.claim.key, v.reference): v for v in claim_verdicts(groups, ttc)}


def test_a_tepo_better_on_every_claim_is_supported_on_each():
    v = _case(tepo_final=0.6, tepo_dd=0.01, tepo_ent=-0.1, tepo_ttc=10.0)
    assert {x.verdict for x in v.values()} == {SUPPORTED}
    assert v["convergence", "grpo"].estimate == pytest.approx(0.5, rel=0.02)  # TEPO / reference, not the inverse
    assert v["final", "grpo"].estimate == pytest.approx(0.1, abs=0.01)  # TEPO − reference


def test_a_tepo_worse_on_every_claim_is_contradicted_on_each():
    v = _case(tepo_final=0.4, tepo_dd=0.15, tepo_ent=-0.9, tepo_ttc=30.0)
    assert {x.verdict for x in v.values()} == {CONTRADICTED}


def test_faster_but_not_by_half_contradicts_the_50_percent_claim_and_says_how_much_faster():
    v = _case(tepo_final=0.5, tepo_dd=0.05, tepo_ent=-0.5, tepo_ttc=16.0)["convergence", "grpo"]
    assert v.verdict == CONTRADICTED and v.high < 1 and "not by half" in v.why


def test_a_verdict_reads_its_interval_not_its_point_estimate():
    """The same mean difference is supported with a tight spread and not resolved with a wide one (and the wide one
    says how many seeds it would need)."""
    tight = _case(tepo_final=0.52, tepo_dd=0.05, tepo_ent=-0.5, tepo_ttc=20.0, noise=0.002)["final", "grpo"]
    wide = _case(tepo_final=0.52, tepo_dd=0.05, tepo_ent=-0.5, tepo_ttc=20.0, noise=0.03)["final", "grpo"]
    assert tight.verdict == SUPPORTED
    assert wide.verdict == UNRESOLVED and wide.seeds_needed > 6
    assert wide.estimate == pytest.approx(tight.estimate, abs=0.03)


def test_intervals_are_bonferroni_over_the_rows_and_unreached_seeds_are_left_out():
    v = _case(tepo_final=0.6, tepo_dd=0.01, tepo_ent=-0.1, tepo_ttc=10.0)
    conv = v["convergence", "grpo"]
    groups = {o: [(s, _derived(f, entropy=_entropy(1.0, -0.5))) for s in range(4)]
              for o, f in (("tepo", 0.6), ("grpo", 0.5))}
    ttc = {"tepo": {0: 10.0, 1: 11.0, 2: None, 3: 9.0}, "grpo": {0: 20.0, 1: 21.0, 2: 20.0, 3: 19.0}}
    (c,) = [x for x in claim_verdicts(groups, ttc) if x.claim.key == "convergence"]
    assert c.n == 3 and "1 seed(s) left out" in c.why
    logs = np.log([10 / 20, 11 / 21, 9 / 19])
    from scipy import stats as st

    h = st.t.ppf(1 - 0.05 / 4 / 2, 2) * logs.std(ddof=1) / math.sqrt(3)  # 4 rows: grpo only
    assert c.low == pytest.approx(math.exp(logs.mean() - h)) and c.high == pytest.approx(math.exp(logs.mean() + h))
    assert conv.n == 6


def test_seeds_needed_agrees_with_the_report_power_analysis_at_the_same_level():
    diffs = [0.02, 0.05, -0.01, 0.04]
    d = np.array(diffs)
    assert seeds_needed(d.mean(), d.std(ddof=1), stats.ALPHA) == stats.power(diffs).seeds_needed


def test_no_claims_without_tepo_and_a_reference():
    groups = {"grpo": [(0, _derived(0.5))], "dapo": [(0, _derived(0.5))]}
    assert claim_verdicts(groups, {}) == []
    assert set(claims.CLAIMS["tepo"].references) == {"grpo", "dapo"}


def test_relative_change_compares_the_last_window_with_the_first():
    ser = [(s, 1.0) for s in range(1, 6)] + [(s, 2.0) for s in range(6, 11)] + [(s, 0.5) for s in range(11, 16)]
    assert relative_change(ser, 5) == pytest.approx(-0.5)
    assert relative_change(ser[:9], 5) is None
