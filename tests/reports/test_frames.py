"""`reports.frames.load_frames`: a comparison as DataFrames, the same numbers `bench report` writes."""

from __future__ import annotations

import pandas as pd
import pytest
from mlflow import MlflowClient

from reports.frames import load_frames
from reports.report import build_report


def test_load_frames_equals_the_report_files(handmade, local_uri, tmp_path):
    handmade.log_comparison(local_uri, experiment="frames", objectives=("grpo", "tepo"), seeds=(0, 1, 2))
    f = load_frames("frames", tracking_uri=local_uri)
    rep = build_report("frames", tracking_uri=local_uri, out_root=tmp_path, figures_too=False, log_artifacts=False,
                       store_derived=False)
    assert sorted(f.tables) == sorted(rep.tables)
    for name in f.tables:
        want = pd.read_csv(rep.out_dir / f"{name}.csv")
        got = f.tables[name]
        assert list(got.columns) == list(want.columns), name
        pd.testing.assert_frame_equal(got.reset_index(drop=True).astype(want.dtypes.to_dict(), errors="ignore"),
                                      want, check_dtype=False, obj=name)
    curves = pd.read_csv(rep.out_dir / "curves.csv")
    pd.testing.assert_frame_equal(f.curves.reset_index(drop=True), curves, check_dtype=False)
    client = MlflowClient(local_uri)
    assert len(f.runs) == 6 and set(f.runs.objective) == {"grpo", "tepo"}
    for _, row in f.runs.iterrows():
        acc = sorted((m.step, m.value) for m in client.get_metric_history(row.run_id, "eval/accuracy"))
        assert row.final_acc == pytest.approx(acc[-1][1]) and row.initial_acc == pytest.approx(acc[0][1])
    assert f.evals.empty and list(f.evals.columns)[:3] == ["run_id", "objective", "seed"]
    assert f.analysis.baseline == "grpo"
