"""`build_report` on hand-made comparisons in real MLflow stores: files, numbers, bad input, server == local."""

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient
from scipy import stats

from bench.cli import main
from reports import metric_keys as K
from reports.report import build_report
from tests.conftest import fresh_store

FIGURES = ["accuracy_vs_step", "accuracy_vs_time", "accuracy_vs_cpu", "accuracy_vs_tokens", "entropy_vs_step",
           "reward_vs_step", "clip_masked_fractions", "time_to_convergence", "compute_fit", "kl_vs_step",
           "grad_norm_vs_step"]
TABLES = ["accuracy", "aggregates", "convergence", "compute_fit", "stability", "paired_test", "runs",
          "runs_stability"]


def _csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _num(s: str) -> float | None:
    return None if s == "" else float(s)


def _history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_report_files_and_numbers_equal_recomputed_from_mlflow(handmade, local_uri, tmp_path, monkeypatch):
    monkeypatch.delenv("POBENCH_FIGURE_FORMATS", raising=False)  # a user's default: every format
    handmade.log_comparison(local_uri, experiment="files", artifacts=tmp_path / "art")
    rep = build_report("files", tracking_uri=local_uri, out_root=tmp_path / "out")
    out = tmp_path / "out" / "files" / "c1"
    assert rep.out_dir == out
    from reports import plots  # the one figure table: every figure drawn (or said why not) has its row, and back
    assert {k for k in rep.figures if ":" not in k} == set(plots.BY_KEY)
    for f in FIGURES:
        assert (out / f"{f}.png").stat().st_size > 10_000 and (out / f"{f}.pdf").stat().st_size > 1_000
        assert (out / f"{f}.svg").stat().st_size > 1_000
    for t in TABLES:
        for ext in ("md", "csv", "tex"):
            assert (out / f"{t}.{ext}").exists()
    assert "\\toprule" in (out / "accuracy.tex").read_text()
    md = (out / "report.md").read_text()
    for f in FIGURES:
        assert f"({f}.png) ([PDF]({f}.pdf), [SVG]({f}.svg)" in md

    # recompute from the raw MLflow series, independently of reports.derived
    client = MlflowClient(tracking_uri=local_uri)
    runs = client.search_runs([client.get_experiment_by_name("files").experiment_id],
                              "tags.`pobench.kind` = 'train'")
    final: dict[str, dict[int, float]] = {}
    best: dict[str, list[float]] = {}
    gain: dict[str, list[float]] = {}
    for r in runs:
        acc = _history(client, r.info.run_id, "eval/accuracy")
        o, s = r.data.tags["pobench.objective"], int(r.data.tags["pobench.seed"])
        final.setdefault(o, {})[s] = acc[-1][1]
        best.setdefault(o, []).append(max(v for _, v in acc))
        gain.setdefault(o, []).append(acc[-1][1] - acc[0][1])
    rows = {r["objective"]: r for r in _csv(out / "accuracy.csv")}
    assert set(rows) == {"grpo", "tepo"}
    for o in rows:
        v = list(final[o].values())
        assert _num(rows[o]["final_mean"]) == pytest.approx(np.mean(v))
        half = stats.t.ppf(0.975, 1) * np.std(v, ddof=1) / math.sqrt(2)
        assert _num(rows[o]["final_ci95"]) == pytest.approx(half)
        assert _num(rows[o]["best_mean"]) == pytest.approx(np.mean(best[o]))
        assert _num(rows[o]["gain_mean"]) == pytest.approx(np.mean(gain[o]))
    pt = _csv(out / "paired_test.csv")
    assert [p["objective"] for p in pt] == ["tepo"]
    want = stats.ttest_rel([final["tepo"][s] for s in (0, 1)], [final["grpo"][s] for s in (0, 1)])
    assert _num(pt[0]["p_value"]) == pytest.approx(want.pvalue) and int(pt[0]["n"]) == 2

    # time to convergence: default target = step-0 accuracy + 0.5 x the improvement of the baseline's (grpo)
    # seed-mean trailing-3 mean curve over it
    def sm(acc):
        return [np.mean([v for _, v in acc[max(0, j - 2): j + 1]]) for j in range(len(acc))]
    accs = {(r.data.tags["pobench.objective"], int(r.data.tags["pobench.seed"])):
            _history(client, r.info.run_id, "eval/accuracy") for r in runs}
    a0 = max(a[0][1] for a in accs.values())
    base_curve = np.mean([sm(accs[("grpo", s)]) for s in (0, 1)], axis=0)
    target = a0 + 0.5 * (max(base_curve) - a0)
    assert rep.target_acc == pytest.approx(target) and max(base_curve) > target > a0
    assert f"≥ {100 * target:.2f}% = step-0 accuracy {100 * a0:.2f}% + 0.5 × the improvement of grpo's" in \
        (out / "report.md").read_text()
    assert "at the crossing interpolated linearly between the two evaluations around it (evaluations every 5 steps)" \
        in (out / "convergence.md").read_text()
    per_run = {(r["objective"], int(r["seed"])): r for r in _csv(out / "runs.csv")}
    ttc, tokens, cpu = {}, {}, {}
    for key, acc in accs.items():
        smoothed = sm(acc)
        j = next((j for j, v in enumerate(smoothed) if v >= target - 1e-12), None)
        first = acc[j][0]
        got = per_run[key]["ttc_step"]
        assert (None if got == "" else int(float(got))) == first and first != 0
        # interpolated: where the line between the smoothed values of evaluations j-1 and j crosses the target
        (s0, v0), (s1, v1) = (acc[j - 1][0], smoothed[j - 1]), (acc[j][0], smoothed[j])
        ttc[key] = s0 + (target - v0) * (s1 - s0) / (v1 - v0)
        assert s0 < ttc[key] <= s1
        assert float(per_run[key]["ttc_step_interp"]) == pytest.approx(ttc[key])
        run_id = [r for r in runs if (r.data.tags["pobench.objective"], int(r.data.tags["pobench.seed"])) == key][0]
        run_id = run_id.info.run_id
        lo = math.floor(ttc[key])

        def at_crossing(by_step: dict, x: float = ttc[key], lo: int = lo) -> float:   # linear between whole steps
            return by_step[lo] + (x - lo) * (by_step[lo + 1] - by_step[lo])

        elapsed = dict(_history(client, run_id, "time/elapsed_s"))
        assert float(per_run[key]["ttc_seconds_interp"]) == pytest.approx(at_crossing(elapsed))
        cpu[key] = at_crossing(dict(_history(client, run_id, "time/cpu_s")))
        assert float(per_run[key]["ttc_cpu_s_interp"]) == pytest.approx(cpu[key])
        per_step = _history(client, run_id, "rollout/gen_tokens")
        tokens[key] = at_crossing({s: sum(v for t, v in per_step if t <= s) for s in range(lo + 2)})
        assert float(per_run[key]["ttc_tokens_interp"]) == pytest.approx(tokens[key])
        assert float(per_run[key]["load_avg"]) == pytest.approx(np.mean([v for _, v in _history(
            client, run_id, "sys/load_avg_1m")]))
    conv = {r["objective"]: r for r in _csv(out / "convergence.csv")}
    t1 = stats.t.ppf(0.975, 1)
    for unit, per_seed in (("steps", ttc), ("tokens", tokens), ("cpu_s", cpu)):
        # geometric mean over seeds with the t interval of the logs; ratios: per seed, then the same on log ratios
        for o in ("grpo", "tepo"):
            logs = np.log([per_seed[(o, s)] for s in (0, 1)])
            h = t1 * np.std(logs, ddof=1) / math.sqrt(2)
            got = [_num(conv[o][f"{unit}_{c}"]) for c in ("gmean", "low95", "high95")]
            assert got == pytest.approx([math.exp(logs.mean()), math.exp(logs.mean() - h), math.exp(logs.mean() + h)])
            assert 0 < got[1] < got[0] < got[2]
        log_ratios = np.log([per_seed[("tepo", s)] / per_seed[("grpo", s)] for s in (0, 1)])
        h = t1 * np.std(log_ratios, ddof=1) / math.sqrt(2)
        assert [_num(conv["tepo"][f"{unit}_ratio_{c}"]) for c in ("gmean", "low95", "high95")] == pytest.approx(
            [math.exp(log_ratios.mean()), math.exp(log_ratios.mean() - h), math.exp(log_ratios.mean() + h)])
        assert _num(conv["grpo"][f"{unit}_ratio_gmean"]) == 1.0
    # tepo's longer answers: fewer steps, but not as many fewer tokens
    assert _num(conv["tepo"]["tokens_ratio_gmean"]) > _num(conv["tepo"]["steps_ratio_gmean"])
    md = (out / "convergence.md").read_text()
    assert "seconds" not in md.split("\n")[0] and "wall-clock" not in md.split("\n")[0]   # no wall-clock column
    assert "ttc wall-clock s (load)" in (out / "runs.md").read_text()
    # stored back into each run
    for r in runs:
        m = client.get_run(r.info.run_id).data.metrics
        assert m["derived/target_acc"] == pytest.approx(target)
        assert m["derived/grad_spikes"] == 1.0   # the hand-made spike at step 13
    # report logged as artifacts of the comparison run
    arts = [a.path for a in client.list_artifacts(rep.artifact_run_id, "report")]
    assert "report/report.md" in arts and "report/accuracy_vs_step.png" in arts
    # the comparison run carries the summary: seed-mean final accuracy, and the paired gain over the baseline (grpo)
    summary = client.get_run(rep.artifact_run_id).data.metrics
    for o, by_seed in final.items():
        assert summary[f"summary/{o}/final_acc_mean"] == pytest.approx(np.mean(list(by_seed.values())))
    assert summary["summary/tepo/gain"] == pytest.approx(np.mean([final["tepo"][s] - final["grpo"][s] for s in (0, 1)]))
    assert 0 <= summary["summary/tepo/prob_improvement"] <= 1 and "summary/grpo/gain" not in summary


def test_never_reached_target_is_stated_not_imputed(handmade, local_uri, tmp_path):
    handmade.log_comparison(local_uri, experiment="never", artifacts=tmp_path / "art")
    build_report("never", tracking_uri=local_uri, out_root=tmp_path / "out", target_acc=0.99,
                 log_artifacts=False, figures_too=False)
    out = tmp_path / "out" / "never" / "c1"
    conv = {r["objective"]: r for r in _csv(out / "convergence.csv")}
    assert conv["grpo"]["reached"] == "0" and conv["grpo"]["steps_gmean"] == "" and conv["grpo"]["cpu_s_gmean"] == ""
    assert conv["grpo"]["steps_ratio_gmean"] == ""
    assert "not reached by 2/2 seeds" in (out / "convergence.md").read_text()
    client = MlflowClient(tracking_uri=local_uri)
    rid = _csv(out / "runs.csv")[0]["run_id"]
    run = client.get_run(rid)
    assert run.data.tags["pobench.derived.ttc_step"] == "not reached"
    assert math.isnan(run.data.metrics["derived/ttc_step"])


def test_bad_input_clear_error_and_no_output(handmade, local_uri, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="no MLflow experiment named 'nope'"):
        build_report("nope", tracking_uri=local_uri, out_root=out)
    MlflowClient(tracking_uri=local_uri).create_experiment("empty", artifact_location=str(tmp_path / "a"))
    with pytest.raises(ValueError, match="no training runs"):
        build_report("empty", tracking_uri=local_uri, out_root=out)
    # one comparison whose runs were trained under different configs
    handmade.log_comparison(local_uri, experiment="mixed", artifacts=tmp_path / "art")
    client = MlflowClient(tracking_uri=local_uri)
    handmade.log_run(client, client.get_experiment_by_name("mixed").experiment_id, "grpo", 2, "c1",
                     config_hash="cfgOTHER")
    with pytest.raises(ValueError, match="different configs.*cfgOTHER: grpo-s2"):
        build_report("mixed", tracking_uri=local_uri, out_root=out)
    with pytest.raises(ValueError, match="baseline 'dapo' has no finished run"):
        build_report("mixed", tracking_uri=local_uri, out_root=out, baseline="dapo",
                     seeds=[0, 1])
    with pytest.raises(ValueError, match="no comparison 'zzz'"):
        build_report("mixed", comparison="zzz", tracking_uri=local_uri, out_root=out)
    assert not out.exists() or not any(out.iterdir())


def test_unfinished_run_is_left_out_and_named(handmade, local_uri, tmp_path):
    handmade.log_comparison(local_uri, experiment="unfinished", artifacts=tmp_path / "art")
    client = MlflowClient(tracking_uri=local_uri)
    handmade.log_run(client, client.get_experiment_by_name("unfinished").experiment_id, "grpo", 2, "c1",
                     status="KILLED")
    rep = build_report("unfinished", tracking_uri=local_uri, out_root=tmp_path / "out", log_artifacts=False,
                       figures_too=False)
    assert len(rep.comparison.runs) == 4
    assert any("grpo-s2" in n and "KILLED" in n for n in rep.notes)
    assert "grpo-s2" in (rep.out_dir / "report.md").read_text()


def _comparable(out: Path, uri: str) -> dict[str, str]:
    """Every table and report.md, with the store-specific run ids and URI removed."""
    res = {}
    for t in TABLES:
        for ext in ("md", "tex", "csv"):
            text = (out / f"{t}.{ext}").read_text()
            if t.startswith("runs") and ext == "csv":
                text = "\n".join(line.split(",", 1)[1] for line in text.splitlines())
            res[f"{t}.{ext}"] = text
    res["report.md"] = (out / "report.md").read_text().replace(uri, "<tracking uri>")
    return res


@pytest.mark.slow
def test_report_from_mlflow_server_equals_local_store(handmade, mlflow_server, local_uri, tmp_path):
    handmade.log_comparison(local_uri, experiment="same", artifacts=tmp_path / "art")
    handmade.log_comparison(mlflow_server, experiment="same")
    # figures are drawn from the same loaded series (checked in the test above); skipped here to save CPU
    a = build_report("same", tracking_uri=local_uri, out_root=tmp_path / "local", figures_too=False)
    b = build_report("same", tracking_uri=mlflow_server, out_root=tmp_path / "server", figures_too=False)
    assert _comparable(a.out_dir, local_uri) == _comparable(b.out_dir, mlflow_server)
    assert a.target_acc == b.target_acc
    client = MlflowClient(tracking_uri=mlflow_server)
    assert "report/report.md" in [x.path for x in client.list_artifacts(b.artifact_run_id, "report")]


def test_cli_report_bad_input_exits_2_with_cause(local_uri, tmp_path, capsys):
    from bench.cli import main

    rc = main(["report", "--experiment", "nope", "--tracking-uri", local_uri, "--out-root", str(tmp_path / "o")])
    assert rc == 2 and "no MLflow experiment named 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_cli_report_picks_most_recent_comparison_and_says_so(handmade, local_uri, tmp_path, capsys):
    from bench.cli import main

    handmade.log_comparison(local_uri, experiment="two", comparison="old", seeds=(0,), artifacts=tmp_path / "art")
    handmade.log_comparison(local_uri, experiment="two", comparison="new", seeds=(0, 1))
    rc = main(["report", "--experiment", "two", "--tracking-uri", local_uri, "--out-root", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert rc == 0 and "reporting the most recent, new (others: old" in out
    rows = _csv(tmp_path / "o" / "two" / "new" / "accuracy.csv")
    assert [int(r["n"]) for r in rows] == [2, 2]


def test_report_formats_png_writes_and_links_only_the_png(handmade, local_uri, tmp_path, capsys, monkeypatch):
    from bench.cli import main

    monkeypatch.delenv("POBENCH_FIGURE_FORMATS", raising=False)
    handmade.log_comparison(local_uri, experiment="fmt", seeds=(0, 1))
    argv = ["report", "--experiment", "fmt", "--tracking-uri", local_uri, "--out-root", str(tmp_path / "o")]
    assert main([*argv, "--formats", "png"]) == 0
    out = tmp_path / "o" / "fmt" / "c1"
    assert {p.suffix for p in out.iterdir() if p.stem in FIGURES and p.suffix in (".png", ".pdf", ".svg")} == {".png"}
    md = (out / "report.md").read_text()
    assert "accuracy_vs_step.png)" in md and "[PDF]" not in md and "[SVG]" not in md
    capsys.readouterr()
    for bad in (["--formats", "pdf"], ["--formats", "png,gif"]):  # report.md shows the PNG; gif is not drawn
        assert main([*argv, *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--formats=" in err[0] and "png, pdf, svg" in err[0], err
    monkeypatch.setenv("POBENCH_FIGURE_FORMATS", "jpeg")
    assert main(argv) == 2 and "POBENCH_FIGURE_FORMATS=jpeg" in capsys.readouterr().err


def test_the_report_keeps_the_baseline_bench_run_chose(handmade, tmp_path):
    uri = fresh_store(tmp_path)
    handmade.log_comparison(uri, experiment="abl", objectives=("tepo", "grpo"), seeds=(0, 1))
    first = build_report("abl", tracking_uri=uri, out_root=tmp_path / "out", baseline="tepo", figures_too=False)
    assert first.baseline == "tepo"
    again = build_report("abl", tracking_uri=uri, out_root=tmp_path / "out", figures_too=False)
    assert again.baseline == "tepo"                                      # recorded on the comparison run
    assert "Baseline: tepo (recorded on the comparison run)" in (again.out_dir / "report.md").read_text()
    assert [r[0] for r in again.tables["paired_test"].rows] == ["grpo"]


def test_runs_written_by_another_pobench_commit_are_named(handmade, local_uri, tmp_path):
    """A comparison whose runs come from two commits (a run `bench run` reused from an earlier checkout): the report
    says which runs were written by which; one commit throughout: no such note."""
    ids = handmade.log_comparison(local_uri, experiment="commits", artifacts=tmp_path / "art")
    same = build_report("commits", tracking_uri=local_uri, out_root=tmp_path / "out", log_artifacts=False,
                        figures_too=False)
    assert not any("written by one identified" in n for n in same.notes)
    client = MlflowClient(tracking_uri=local_uri)
    for run_id in ids:
        client.set_tag(run_id, "pobench.git_commit", "1111111111aaaa")
    old = ids[0]
    client.set_tag(old, "pobench.git_commit", "0123456789abcdef")
    rep = build_report("commits", tracking_uri=local_uri, out_root=tmp_path / "out", log_artifacts=False,
                       figures_too=False)
    (note,) = [n for n in rep.notes if "written by one identified" in n]
    tags = client.get_run(old).data.tags
    name = f"{tags.get('pobench.variant') or tags['pobench.objective']} seed {tags['pobench.seed']}"
    assert f"at commit 0123456789: {name}" in note and "at commit 1111111111: " in note
    assert note in (tmp_path / "out" / "commits" / "c1" / "report.md").read_text()


def test_stability_sees_a_run_fall_apart_either_way(handmade, local_uri, tmp_path):
    """A pilot's runs fell apart (held-out accuracy 61% -> 0.2%) while their entropy ROSE, and the stability table said
    "entropy collapse: none". Here dapo falls apart at seeds 0 and 1 (seed 2 is fine): the table counts the seeds
    where the entropy blew up and the accuracy collapsed and says when; drawdown in points; runs.csv, the per-run
    table and the derived metrics in MLflow hold each run's step."""
    client = MlflowClient(tracking_uri=local_uri)
    exp = client.create_experiment("apart", artifact_location=str(tmp_path / "art"))
    for o in ("grpo", "dapo"):
        for s in (0, 1, 2):
            ser = handmade.series(o, s)
            ser["rollout/entropy_mean"] = [(st, 0.3 + 0.001 * st) for st in range(1, 21)]
            if o == "dapo" and s < 2:
                start = 6 + 6 * s                                   # falls apart from step 6 (seed 0), 12 (seed 1)
                ser["eval/accuracy"] = [(st, 0.61 if st < start else 0.002) for st, _ in ser["eval/accuracy"]]
                ser["rollout/entropy_mean"] = [(st, 0.3 if st < start else 0.3 + 0.2 * (st - start + 1))
                                               for st in range(1, 21)]
            handmade.log_run(client, exp, o, s, "c1", series=ser)
    rep = build_report("apart", tracking_uri=local_uri, out_root=tmp_path / "out", log_artifacts=False,
                       figures_too=False)
    stab = {r["objective"]: r for r in _csv(rep.out_dir / "stability.csv")}
    # blow-up: first step with entropy > 2 x 0.3, i.e. 0.3 + 0.2 k > 0.6 at k = 2: steps 7 and 13
    assert (stab["dapo"]["entropy_blowup_seeds"], stab["dapo"]["acc_collapse_seeds"]) == ("2", "2")
    assert (stab["grpo"]["entropy_blowup_seeds"], stab["grpo"]["acc_collapse_seeds"]) == ("0", "0")
    assert stab["dapo"]["entropy_collapse_seeds"] == "0"
    row = next(r for r in rep.tables["stability"].rows if r[0] == "dapo")
    cols = rep.tables["stability"].columns
    assert row[cols.index("entropy blow-up")] == "2/3 seeds: step 7, 13"
    assert row[cols.index("acc. collapse")] == "2/3 seeds: step 10, 15"    # the first evaluation after (every 5)
    assert row[cols.index("entropy collapse")] == "none (0/3)"
    grpo = next(r for r in rep.tables["stability"].rows if r[0] == "grpo")
    assert grpo[cols.index("entropy blow-up")] == "none (0/3)"
    # the drawdown in points, as every accuracy of the report (0.61 - 0.002 = 60.8 points at seeds 0 and 1)
    dd = [rep.derived[r.run_id].acc_drawdown for r in rep.comparison.runs if r.variant == "dapo"]
    half = stats.t.ppf(0.975, 2) * np.std(dd, ddof=1) / math.sqrt(3)
    assert row[cols.index("acc. drawdown")] == f"{100 * np.mean(dd):.1f} ± {100 * half:.1f}"
    caption = rep.tables["stability"].caption
    assert "> 2 × its initial value" in caption and "< 0.5 × its step-0 value" in caption and "(points)" in caption
    per_run = {(r["objective"], int(r["seed"])): r for r in _csv(rep.out_dir / "runs.csv")}
    assert per_run[("dapo", 0)]["entropy_blowup_step"] == "7" and per_run[("dapo", 1)]["acc_collapse_step"] == "15"
    assert per_run[("dapo", 2)]["entropy_blowup_step"] == "" and per_run[("grpo", 0)]["acc_collapse_step"] == ""
    md = (rep.out_dir / "runs_stability.md").read_text()
    assert "| dapo | 0 | none | 7 | 10 | 60.8 |" in md
    for r in rep.comparison.runs:
        run = client.get_run(r.run_id).data
        if r.variant == "dapo" and r.seed == 1:
            assert run.metrics["derived/entropy_blowup_step"] == 13 and run.metrics["derived/acc_collapse_step"] == 15
            assert run.tags["pobench.derived.entropy_blowup_step"] == "blown up"
        if r.variant == "grpo":
            assert math.isnan(run.metrics["derived/entropy_blowup_step"])
            assert run.tags["pobench.derived.entropy_blowup_step"] == "not blown up"
            assert run.tags["pobench.derived.acc_collapse_step"] == "not collapsed"


def test_a_recorded_pair_whose_run_was_deleted_is_named_and_the_baseline_kept(handmade, local_uri, tmp_path,
                                                                             capsys):
    """Held-out round 5: after one pair's run was deleted from MLflow, `bench report` and `bench compare` reported
    the remaining objective as if it were the comparison, switched the baseline to it and recorded that on the
    comparison run. Now the missing pair is named (report notes, the command's output, compare.md), the report's
    stand-in baseline is said, and the comparison keeps its recorded baseline."""
    from reports.compare import compare_comparisons

    ids = handmade.log_comparison(local_uri, experiment="deleted", objectives=("grpo", "tepo"), seeds=(0,))
    handmade.log_comparison(local_uri, experiment="deleted", comparison="c2", objectives=("grpo", "tepo"),
                            seeds=(0,))
    client = MlflowClient(tracking_uri=local_uri)
    exp_id = client.get_experiment_by_name("deleted").experiment_id
    crun = client.create_run(exp_id, run_name="comparison-c1", tags={  # as `bench run` records it
        "pobench.kind": "comparison", "pobench.comparison": "c1", "pobench.objectives": "grpo,tepo",
        "pobench.seeds": "0", "pobench.baseline": "grpo"})
    client.delete_run(ids[0])  # grpo seed 0
    rep = build_report("deleted", "c1", tracking_uri=local_uri, out_root=tmp_path / "out", figures_too=False)
    missing = [n for n in rep.notes if "grpo seed 0" in n and "no run in the store" in n]
    assert len(missing) == 1 and rep.baseline == "tepo", rep.notes
    assert any("recorded baseline grpo has no finished run here" in n for n in rep.notes), rep.notes
    assert missing[0] in (rep.out_dir / "report.md").read_text()
    assert client.get_run(crun.info.run_id).data.tags["pobench.baseline"] == "grpo"  # not retagged
    assert main(["report", "--experiment", "deleted", "--comparison", "c1", "--tracking-uri", local_uri,
                 "--out-root", str(tmp_path / "out2")]) == 0
    assert "grpo seed 0" in capsys.readouterr().out
    res = compare_comparisons([("deleted", "c1"), ("deleted", "c2")], local_uri, out_root=tmp_path / "out3")
    assert "grpo seed 0" in (res.out_dir / "compare.md").read_text()


def test_a_metrics_key_no_run_logged_is_said_on_the_terminal(handmade, local_uri, tmp_path, capsys):
    """Held-out round 8: `bench report --metrics train/typo` exited 0 with its only trace inside report.md ("not
    drawn: no run logged ..."): the command now says it too; a key the runs logged is drawn and not mentioned."""
    from bench.cli import main

    handmade.log_comparison(local_uri, experiment="mk", seeds=(0, 1))
    rc = main(["report", "--experiment", "mk", "--tracking-uri", local_uri, "--out-root", str(tmp_path / "o"),
               "--metrics", f"train/typo,{K.REWARD_MEAN}"])
    out = capsys.readouterr().out
    assert rc == 0 and "note: --metrics train/typo: not drawn: no run logged `train/typo`" in out, out
    assert f"--metrics {K.REWARD_MEAN}" not in out
