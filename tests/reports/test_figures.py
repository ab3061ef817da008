"""Figures for print: a distinct colour, marker and dash per series; Type 42 fonts in the PDF, SVG beside it; 95% CI
bands by default; the legend outside when it would cover data; no figure without data; curves.csv reproduces every
plotted series."""

from __future__ import annotations

import re
import shutil
import subprocess
import types

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from reports import figures as F


def test_every_series_of_a_figure_gets_its_own_colour_marker_and_dash():
    n = len(F.PALETTE)
    assert len({F.style(i)["color"] for i in range(n)}) == n            # no colour repeats within the palette
    assert len({F.style(i)["marker"] for i in range(n)}) == n           # nor a marker: a grayscale print separates
    pairs = {(F.style(i)["marker"], F.style(i)["linestyle"]) for i in range(52)}
    assert len(pairs) == 52
    assert "#F0E442" not in F.PALETTE                                    # Okabe-Ito's pale yellow left out


def test_seed_band_is_the_t_interval_or_the_range():
    seeds = [[(0, 0.2), (5, 0.5)], [(0, 0.3), (5, 0.7)], [(0, 0.25), (5, 0.4)]]
    steps, mean, lo, hi, n = F.seed_band(seeds)
    v = np.array([0.5, 0.7, 0.4])
    h = stats.t.ppf(0.975, 2) * v.std(ddof=1) / np.sqrt(3)
    assert list(steps) == [0, 5] and list(n) == [3, 3]
    assert (lo[1], hi[1]) == (pytest.approx(v.mean() - h), pytest.approx(v.mean() + h))
    _, _, lo, hi, _ = F.seed_band(seeds, "minmax")
    assert (lo[1], hi[1]) == (0.4, 0.7)
    _, mean, lo, hi, n = F.seed_band([[(0, 0.2), (5, 0.5)], [(0, 0.4)]])   # one seed at step 5: no band there
    assert n[1] == 1 and lo[1] == hi[1] == mean[1] == 0.5
    with pytest.raises(ValueError, match="band"):
        F.FigureOptions(band="sd")


def test_a_band_is_clipped_to_the_values_the_metric_can_take():
    """Two seeds at accuracy 0.0 and 0.25: the t band (12.7 × s/√2) spans about -1.5 .. 1.7; an accuracy band is
    drawn within [0, 1], an entropy band from 0, an unbounded metric (the loss) as computed; the mean is not moved."""
    seeds = [[(1, 0.0)], [(1, 0.25)]]
    h = stats.t.ppf(0.975, 1) * np.std([0.0, 0.25], ddof=1) / np.sqrt(2)
    _, mean, lo, hi, _ = F.seed_band(seeds, key="eval/accuracy")
    assert (lo[0], hi[0], mean[0]) == (0.0, 1.0, 0.125)
    _, _, lo, hi, _ = F.seed_band(seeds, key="rollout/entropy_mean")
    assert lo[0] == 0.0 and hi[0] == pytest.approx(0.125 + h)
    _, _, lo, hi, _ = F.seed_band(seeds, key="train/loss")
    assert (lo[0], hi[0]) == (pytest.approx(0.125 - h), pytest.approx(0.125 + h))
    assert F.value_range("eval/gsm8k/pass_at_4") == (0.0, 1.0) == F.value_range("rollout/zero_adv_frac")


def _runs(n_objectives: int, seeds=(0, 1, 2), spread: float = 0.3):
    out = []
    for i in range(n_objectives):
        for s in seeds:
            rng = np.random.default_rng(100 * i + s)
            acc = [(st, 0.2 + spread * st / 10 * (1 + 0.1 * i) + rng.normal(0, 0.01)) for st in range(0, 11, 2)]
            out.append(types.SimpleNamespace(variant=f"obj{i}", seed=s, series={"eval/accuracy": acc}))
    return out


def test_pdf_has_type42_fonts_svg_beside_it_and_titles_are_optional(tmp_path):
    runs = _runs(3)
    order = [f"obj{i}" for i in range(3)]
    d = F.series_figure(runs, "eval/accuracy", "acc", "A title", tmp_path, "fig", order)
    assert sorted(p.suffix for p in d.paths) == [".pdf", ".png", ".svg"]
    pdf = (tmp_path / "fig.pdf").read_bytes()
    assert b"/FontType 3" not in pdf and b"/Subtype /Type3" not in pdf
    assert b"/FontFile2" in pdf                                         # Type 42: the TrueType font program embedded
    if shutil.which("pdffonts"):
        fonts = subprocess.run(["pdffonts", str(tmp_path / "fig.pdf")], capture_output=True, text=True).stdout
        assert "Type 3" not in fonts and "TrueType" in fonts, fonts
    bare = F.series_figure(runs, "eval/accuracy", "acc", "A title", tmp_path, "bare", order,
                           F.FigureOptions(titles=False))
    assert bare.series == d.series
    # the SVG draws text as paths: the title is the only text that differs, so the bare figure has fewer glyphs
    glyphs = [len(re.findall(r"<use xlink:href", (tmp_path / f"{n}.svg").read_text())) for n in ("fig", "bare")]
    assert glyphs[0] - glyphs[1] == len("A title")  # (the space is a glyph too)


def test_legend_moves_outside_when_there_are_many_series_or_it_covers_data(tmp_path):
    import matplotlib.pyplot as plt

    def placed(n_series: int, cover: bool) -> bool:
        """True when the legend is outside the axes."""
        fig, ax = plt.subplots(figsize=F.SIZE)
        x = np.linspace(0, 1, 30)
        for i in range(n_series):
            y = (np.sin(20 * x + i) + 1) / 2 if cover else 0.4 + 0.05 * i + 0 * x   # covering: lines everywhere
            ax.plot(x, y, label=f"s{i}", **F.style(i))
        F.legend(fig, ax)
        leg = ax.get_legend()
        box, axes = leg.get_window_extent(), ax.get_window_extent()
        plt.close(fig)
        return box.x0 >= axes.x1 - 1

    assert not placed(2, cover=False)        # two flat lines in the middle: the legend fits in a corner
    assert placed(2, cover=True)             # lines all over the axes: outside
    assert placed(F.LEGEND_INSIDE_MAX + 1, cover=False)


def test_report_figures_curves_csv_reproduces_every_series(handmade, local_uri, tmp_path):
    """Each drawn series (seed mean and band per step, x = step, seconds or tokens) recomputed from curves.csv."""
    from mlflow import MlflowClient

    from reports.report import build_report

    client = MlflowClient(local_uri)
    exp = client.create_experiment("curves", artifact_location=str(tmp_path / "art"))
    for o in ("grpo", "tepo"):
        for s in (0, 1, 2):
            ser = handmade.series(o, s)
            ser["rollout/gen_tokens"] = [(st, 100.0 * st + 7 * s) for st in range(1, 21)]
            ser["rollout/length_mean"] = [(st, 20.0 + st + s) for st in range(1, 21)]
            handmade.log_run(client, exp, o, s, "c1", series=ser)
    rep = build_report("curves", tracking_uri=local_uri, out_root=tmp_path / "out", log_artifacts=False,
                       store_derived=False)
    df = pd.read_csv(rep.out_dir / "curves.csv")
    assert list(df.columns) == ["comparison", "objective", "seed", "run_id", "step", "elapsed_s", "cpu_s", "tokens",
                                "metric", "value"]
    assert (rep.out_dir / "curves.parquet").exists()
    assert pd.read_parquet(rep.out_dir / "curves.parquet").shape == df.shape

    def check(fig_key: str, metric: str, x: str):
        drawn = rep.figures[fig_key]
        assert isinstance(drawn, F.Drawn), drawn
        sub = df[df.metric == metric]
        for obj, series in drawn.series.items():
            rows = sub[sub.objective == obj]
            g = rows.groupby("step")
            mean, sd, n = g.value.mean(), g.value.std(ddof=1), g.value.count()
            want_x = g[x].mean() if x != "step" else pd.Series(mean.index, index=mean.index)
            assert series["x"] == pytest.approx(list(want_x)), (fig_key, obj)
            assert series["mean"] == pytest.approx(list(mean))
            half = stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)
            assert series["high"] == pytest.approx(list(mean + half))

    check("accuracy_vs_step", "eval/accuracy", "step")
    check("accuracy_vs_time", "eval/accuracy", "elapsed_s")
    check("accuracy_vs_cpu", "eval/accuracy", "cpu_s")
    check("accuracy_vs_tokens", "eval/accuracy", "tokens")
    check("length", "rollout/length_mean", "step")
    check("kl", "train/kl_ref", "step")
    check("grad_norm", "train/grad_norm", "step")
    # tokens: the cumulative sum of rollout/gen_tokens; seconds: time/elapsed_s at the step
    one = df[(df.metric == "eval/accuracy") & (df.objective == "tepo") & (df.seed == 2) & (df.step == 10)].iloc[0]
    assert one.tokens == sum(100.0 * st + 14 for st in range(1, 11)) and one.elapsed_s == pytest.approx(17.2)
    assert one.cpu_s == pytest.approx(0.9 * 10 + 0.05 * 100 + 0.04)


def test_no_figure_for_a_quantity_without_data_and_no_inf_without_a_target(handmade, local_uri, tmp_path):
    from mlflow import MlflowClient

    from reports.report import build_report

    client = MlflowClient(local_uri)
    exp = client.create_experiment("flatbase", artifact_location=str(tmp_path / "art"))
    for o in ("grpo", "dapo"):
        for s in (0, 1):
            ser = handmade.series(o, s)
            if o == "grpo":  # the baseline never improves: no default convergence target
                ser["eval/accuracy"] = [(st, 0.2) for st, _ in ser["eval/accuracy"]]
            del ser["train/kl_ref"], ser["rollout/gen_tokens"]
            handmade.log_run(client, exp, o, s, "c1", series=ser)
    rep = build_report("flatbase", tracking_uri=local_uri, out_root=tmp_path / "out", log_artifacts=False)
    assert rep.target_acc is None
    md = (rep.out_dir / "report.md").read_text()
    assert "time to convergence: not drawn: no convergence target (grpo did not improve over step 0" in md
    assert "KL to the reference vs step: not drawn: no run logged `train/kl_ref`" in md
    assert "generated tokens: not drawn: 4 run(s) did not log `rollout/gen_tokens`" in md
    assert not (rep.out_dir / "kl_vs_step.png").exists() and not (rep.out_dir / "time_to_convergence.png").exists()
    for f in rep.out_dir.iterdir():
        if f.suffix in (".md", ".tex", ".csv"):
            assert not re.search(r"\binf\b|\bNone\b", f.read_text()), f.name
    run = client.get_run(rep.comparison.runs[0].run_id)
    assert run.data.tags["pobench.derived.target_acc"] == "no target"
    assert run.data.tags["pobench.derived.ttc_step"] == "no target"


def test_crowded_figures_keep_bands_in_per_objective_panels(tmp_path):
    import matplotlib.pyplot as plt

    x, m = np.arange(3), np.array([0.2, 0.3, 0.4])
    fig, ax = plt.subplots()
    F._line(ax, x, m, m - 0.1, m + 0.1, 0, "a", 3)
    F._line(ax, x, m, m - 0.1, m + 0.1, 1, "b", 3, crowded=True)
    assert len(ax.collections) == 1                      # the crowded series drew its line only
    plt.close(fig)
    runs = _runs(F.CROWDED + 1)
    order = [f"obj{i}" for i in range(F.CROWDED + 1)]
    d = F.panels_figure(runs, "eval/accuracy", "acc", "T", tmp_path, "p", order, reference="obj0")
    assert sorted(d.series) == order and (tmp_path / "p.pdf").exists()
    assert all(s["high"][-1] > s["mean"][-1] for s in d.series.values())   # each panel has its band
