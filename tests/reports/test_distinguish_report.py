"""The report's "what differs under this configuration" table, computed from the runs' params and measured drift."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from reports.load import load_comparison
from reports.record import get_or_create_experiment
from reports.report import build_report

LOOP = {"update_epochs": 1, "prompts_per_step": 16, "group_size": 8, "micro_batch_size": 64, "max_new_tokens": 48,
        "lr": 3e-5}


def _log(uri, experiment, objectives, minibatches, drift, handmade):
    client = MlflowClient(tracking_uri=uri)
    exp_id = get_or_create_experiment(client, uri, experiment)  # (its files beside the store, as pobench's)
    for o in objectives:
        for seed in (0, 1):
            run = client.create_run(exp_id, run_name=f"{o}-s{seed}", tags={
                "pobench.kind": "train", "pobench.objective": o, "pobench.seed": str(seed),
                "pobench.comparison": "c1", "pobench.config_hash": "cfg1", "pobench.overrides": json.dumps({})})
            rid = run.info.run_id
            for k, v in {**LOOP, "minibatches": minibatches, "model": "builtin:tiny-arith", "steps": 10}.items():
                client.log_param(rid, k, v)
            series = handmade.series(o, seed)
            series["train/abs_log_ratio"] = [(s, drift) for s in range(1, 11)]
            client.log_batch(rid, metrics=[Metric(k, v, 1_700_000_000_000 + s, s) for k, ser in series.items()
                                           for s, v in ser])
            client.set_terminated(rid)


def test_on_policy_comparison_reports_coinciding_objectives(handmade, local_uri, tmp_path):
    _log(local_uri, "probe-on", ["dapo", "kl_cov", "grpo"], 1, 0.0, handmade)
    rep = build_report("probe-on", tracking_uri=local_uri, out_root=tmp_path, figures_too=False)
    table = rep.tables["distinguishability"]
    rows = {r[0]: r for r in table.rows}
    assert rows["dapo"][1] == "kl_cov" and rows["kl_cov"][1] == "dapo" and rows["grpo"][1] == "none"
    assert "on-policy" in table.caption
    assert any("dapo == kl_cov" in n for n in rep.notes)
    md = (tmp_path / "probe-on" / "c1" / "report.md").read_text()
    assert "What differs under this configuration" in md


def test_off_policy_comparison_uses_the_measured_drift(handmade, local_uri, tmp_path):
    from reports.distinguish import measured_drift

    _log(local_uri, "probe-off", ["dapo", "kl_cov"], 4, 0.003, handmade)
    cmp = load_comparison("probe-off", None, local_uri)
    assert measured_drift(cmp) == pytest.approx(0.003 / 1.5)  # 4 mini-batches average 1.5 prior updates
    rep = build_report("probe-off", tracking_uri=local_uri, out_root=tmp_path, figures_too=False)
    table = rep.tables["distinguishability"]
    assert "measured" in table.caption and "k=3" in table.caption
    assert all(r[1] == "none" for r in table.rows)
