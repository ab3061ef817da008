"""The report says what a comparison cannot support and compares like with like: verifier accuracy and shaped reward
as separate series, DAPO's refill rounds apart, no panel for a quantity that never varies, a note when seeds are too
few or intervals overlap, Wilson intervals for a run's final accuracy."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from reports import checks
from reports.record import get_or_create_experiment
from reports.report import build_report


def _log(uri, experiment, objectives, seeds, handmade, edit):
    client = MlflowClient(tracking_uri=uri)
    exp_id = get_or_create_experiment(client, uri, experiment)  # (its files beside the store, as pobench's)
    for o in objectives:
        for s in seeds:
            series = handmade.series(o, s)
            edit(o, s, series)
            handmade.log_run(client, exp_id, o, s, "c1", series=series)


def _dapo_like(o, s, series):
    """DAPO: shaped reward below its verifier accuracy, refill rounds; clip_frac_high all zero for every objective."""
    steps = [st for st, _ in series["rollout/reward_mean"]]
    series["rollout/accuracy"] = [(st, v + 0.05) for st, v in series["rollout/reward_mean"]]
    if o == "dapo":
        series["rollout/reward_mean"] = [(st, v - 0.07) for st, v in series["rollout/reward_mean"]]
        series["rollout/refill_completions"] = [(st, float(8 * (st % 3))) for st in steps]
    series["objective/clip_frac_high"] = [(st, 0.0) for st in steps]


def test_two_seeds_support_no_ranking_and_constant_panels_are_not_drawn(handmade, local_uri, tmp_path):
    _log(local_uri, "two-seeds", ("grpo", "dapo"), (0, 1), handmade, _dapo_like)
    rep = build_report("two-seeds", tracking_uri=local_uri, out_root=tmp_path / "out")
    md = (rep.out_dir / "report.md").read_text()
    assert "No ranking is supported: 2 seed(s) per objective (fewer than 3)" in md
    names = {p.name for p in rep.files}
    assert {"train_accuracy_vs_step.png", "reward_vs_step.png", "refill_vs_step.png"} <= names
    assert [k for k, _ in _panels(rep)] == ["objective/clip_frac_low"]  # the all-zero high-side panel is gone
    assert "(train_accuracy_vs_step.png)" in md and "(reward_vs_step.png)" in md


def _panels(rep):
    from reports.figures import fraction_panels

    return fraction_panels(rep.comparison.runs)


def test_a_quantity_that_never_varies_gets_a_reason_not_a_figure(handmade, local_uri, tmp_path):
    def flat(o, s, series):
        series["rollout/accuracy"] = [(st, 0.5) for st, _ in series["rollout/reward_mean"]]
        for k in ("objective/clip_frac_low", "objective/clip_frac_high", "objective/masked_frac"):
            series[k] = [(st, 0.0) for st, _ in series["rollout/reward_mean"]]

    _log(local_uri, "flat", ("grpo", "tepo"), (0, 1, 2), handmade, flat)
    rep = build_report("flat", tracking_uri=local_uri, out_root=tmp_path / "out")
    md = (rep.out_dir / "report.md").read_text()
    assert "not drawn: `rollout/accuracy` is 0.5 at every step of every run" in md
    assert "not drawn: no clip / mask / selection fraction varies in any run" in md
    assert "not drawn: no run logged `rollout/refill_completions`" in md
    names = {p.name for p in rep.files}
    assert "train_accuracy_vs_step.png" not in names and "clip_masked_fractions.png" not in names


def test_overlapping_intervals_with_three_seeds_are_stated(handmade, local_uri, tmp_path):
    _log(local_uri, "three", ("grpo", "tepo"), (0, 1, 2), handmade, lambda o, s, series: None)
    rep = build_report("three", tracking_uri=local_uri, out_root=tmp_path / "out")
    finals = {o: [d.final_acc for r, d in ((r, rep.derived[r.run_id]) for r in rep.comparison.runs)
                  if r.variant == o] for o in ("grpo", "tepo")}
    from reports.tables import mean_ci

    expected = checks.ranking_note(finals, mean_ci)
    (tg, hg), (tt, ht) = mean_ci(finals["grpo"]), mean_ci(finals["tepo"])
    overlap = tt - ht <= tg + hg
    assert (expected is not None) == overlap
    assert any("No ranking" in n for n in rep.notes) == overlap


def test_ranking_note_by_hand():
    from reports.tables import mean_ci

    apart = {"a": [0.80, 0.81, 0.82], "b": [0.50, 0.51, 0.52]}
    assert checks.ranking_note(apart, mean_ci) is None
    close = {"a": [0.80, 0.60, 0.70], "b": [0.65, 0.62, 0.68]}
    assert "No ranking of a against b" in checks.ranking_note(close, mean_ci)
    assert "2 seed(s)" in checks.ranking_note({"a": [0.8, 0.81], "b": [0.5, 0.51]}, mean_ci)


def test_target_met_at_the_first_evaluation_is_stated():
    note = checks.first_evaluation_note([5, 5, 5], [5, 5, 5], 0.46, [0.455, 0.461])
    assert "first evaluation" in note and "--target-acc" in note
    assert checks.first_evaluation_note([5, 10], [5, 5], 0.5, [0.4]) is None
    assert checks.first_evaluation_note([5, None], [5, 5], 0.5, [0.4]) is None


def test_final_accuracy_interval_is_wilson_and_correct_at_zero():
    lo, hi = checks.final_acc_interval(0.0, 5)
    assert lo == 0.0 and hi == pytest.approx(0.4345, abs=1e-4)
    assert checks.final_acc_interval(0.5, None) == (None, None)


def test_a_difference_reads_the_same_way_in_the_notes_and_the_paired_table(handmade, local_uri, tmp_path):
    """The default comparison's paired table said dapo's diff was −0.4 (dapo − grpo) while the note said "dapo
    (observed +0.4" (grpo − dapo). Every difference is now objective − baseline, or written out "X − Y"."""
    import re

    _log(local_uri, "signs", ("grpo", "dapo"), (0, 1), handmade, lambda o, s, series: None)   # grpo learns faster
    rep = build_report("signs", tracking_uri=local_uri, out_root=tmp_path / "out", log_artifacts=False,
                       figures_too=False, store_derived=False)
    (row,) = rep.tables["paired_test"].rows
    diff = row[rep.tables["paired_test"].columns.index("diff")]
    assert row[:2] == ["dapo", "grpo"] and diff.startswith("\u2212")                   # dapo − grpo < 0
    (note,) = [n for n in rep.notes if "To separate grpo" in n]
    assert re.search(r"dapo \(observed dapo − grpo = (\S+),", note).group(1) == diff
    md = (rep.out_dir / "report.md").read_text()
    assert f"dapo − grpo = {diff}" in md and f"| dapo | grpo | 2 | {diff} |" in md


def test_the_power_note_names_each_difference():
    """Against the best objective (here not the baseline): each difference written out as other − best."""
    from reports.derived import derive
    from reports.sections import paired_rows, paired_table, power_note
    from reports.tables import Units

    def run(final):
        return derive({"eval/accuracy": [(0, 0.5), (10, final)]}, None)

    groups = {"grpo": [(s, run(v)) for s, v in enumerate((0.60, 0.62, 0.61))],
              "tepo": [(s, run(v)) for s, v in enumerate((0.66, 0.65, 0.69))]}
    note = power_note(groups, "tepo", ["grpo"], Units())
    assert "grpo (observed grpo − tepo = \u22125.7," in note
    (row,) = paired_table(paired_rows(groups, "grpo"), "grpo", Units()).rows
    assert row[:2] == ["tepo", "grpo"] and row[3] == "+5.7"                            # tepo − grpo
