"""`bench eval --comparison ID --benchmarks ...` on a real comparison of the tiny model: every final model evaluated
once, nested under its training run; stored results reused; `bench report` adds the benchmarks table."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from mlflow import MlflowClient

from bench.cli import main
from bench.runs.tracking import version_tags
from tests.conftest import fresh_store

RUN = ["run", "--algos", "grpo,tepo", "--seeds", "0,1", "--steps", "2", "--prompts-per-step", "2", "--group-size",
       "2", "--eval-problems", "8", "--eval-every", "1", "--max-new-tokens", "16", "--samples-every", "0",
       "--workers", "1", "--no-progress", "--no-report", "--experiment", "ev"]


def _evals(client, exp_id):
    return client.search_runs([exp_id], "tags.`pobench.kind` = 'eval'")


@pytest.mark.slow
def test_eval_comparison_evaluates_each_final_model_once_and_the_report_tabulates_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    uri = fresh_store(tmp_path)
    assert main([*RUN, "--tracking-uri", uri]) == 0
    client = MlflowClient(uri)
    exp_id = client.get_experiment_by_name("ev").experiment_id
    train = {r.info.run_id: r for r in client.search_runs([exp_id], "tags.`pobench.kind` = 'train'")}
    (cid,) = {r.data.tags["pobench.comparison"] for r in train.values()}
    capsys.readouterr()

    args = ["eval", "--comparison", cid, "--experiment", "ev", "--benchmarks", "arith", "--tracking-uri", uri,
            "--temperature", "0", "--max-new-tokens", "16"]
    assert main([*args, "--limit", "8"]) == 0
    assert "4 runs x 1 benchmarks; 0 stored, 4 to evaluate" in capsys.readouterr().err
    evals = _evals(client, exp_id)
    assert len(evals) == 4
    for e in evals:
        parent = train[e.data.tags["mlflow.parentRunId"]]           # nested under its training run
        assert e.data.tags["pobench.benchmark"] == "arith" and e.data.tags["pobench.comparison"] == cid
        assert set(e.data.tags) == {"mlflow.runName", "mlflow.parentRunId", "pobench.git_commit", "pobench.kind",
                                    "pobench.version", "pobench.benchmark", "pobench.eval_key", "pobench.comparison",
                                    "pobench.final_digest", *version_tags()}
        # (version_tags: from a git checkout, the commit under MLflow's name, dirty)
        # the final model, greedy, on the same 8 held-out problems the run's last evaluation used
        assert e.data.metrics["eval/arith/greedy_acc"] == pytest.approx(parent.data.metrics["eval/accuracy"])

    # the same command again: everything stored, nothing evaluated
    assert main([*args, "--limit", "8"]) == 0
    assert "4 stored, 0 to evaluate" in capsys.readouterr().err
    assert len(_evals(client, exp_id)) == 4
    # a notebook's call of the library, with the settings those flags give: the same evaluations, all reused
    from bench.comparison.evals import EvalSettings, plan_evaluations

    plan = plan_evaluations("ev", cid, ["arith"], EvalSettings(limit=8, temperature=0.0, max_new_tokens=16), uri,
                            client)
    assert (plan.reused, plan.missing, plan.total) == (4, 0, 4)
    plan = plan_evaluations("ev", cid, ["arith"], EvalSettings(limit=8, temperature=0.0, max_new_tokens=17), uri,
                            client)
    assert (plan.reused, plan.missing) == (0, 4)
    # other settings are another evaluation
    assert main([*args, "--limit", "6"]) == 0
    assert "0 stored, 4 to evaluate" in capsys.readouterr().err
    evals = _evals(client, exp_id)
    assert len(evals) == 8

    # bench report: the newest settings that cover every run (--limit 6), mean ± t CI over seeds per objective
    assert main(["report", "--experiment", "ev", "--tracking-uri", uri, "--no-store"]) == 0
    out = tmp_path / "reports" / "out" / "ev" / cid
    with open(out / "benchmarks.csv") as f:
        rows = {r["objective"]: r for r in csv.DictReader(f)}
    six = [e for e in evals if e.data.params["limit"] == "6"]
    for obj, row in rows.items():
        vals = [e.data.metrics["eval/arith/greedy_acc"] for e in six
                if train[e.data.tags["mlflow.parentRunId"]].data.tags["pobench.objective"] == obj]
        assert len(vals) == 2 and float(row["arith_mean"]) == pytest.approx(np.mean(vals))
    assert "Benchmark accuracy of the final models" in (out / "report.md").read_text()

    # a final model that is gone: one line naming it, nothing evaluated
    import shutil

    shutil.rmtree(tmp_path / ".pobench" / "runs" / "ev" / next(iter(train.values())).info.run_name / "final")
    assert main([*args, "--limit", "5"]) == 2
    err = capsys.readouterr().err
    assert "final model(s) moved or deleted" in err and err.count("\n") == 1
    assert len(_evals(client, exp_id)) == 8


def test_eval_comparison_refuses_flags_that_do_not_apply(capsys):
    assert main(["eval", "--comparison", "c1", "--benchmarks", "arith", "--model", "x"]) == 2
    assert "drop --model" in capsys.readouterr().err
    assert main(["eval", "--comparison", "c1", "--benchmarks", "arith", "--no-mlflow"]) == 2
    assert "drop --no-mlflow" in capsys.readouterr().err


def test_a_stored_evaluation_is_not_reused_once_the_final_weights_changed(tmp_path, bench_here):
    """Held-out round 8 (F6): `bench eval --comparison` again after a run's `final/model.safetensors` was replaced
    said "1 stored, 0 to evaluate" and reported the old accuracy for weights that now score otherwise. The stored
    evaluation records the final weights' digest (`pobench.final_digest`) and is reused on a match only; other
    weights are evaluated again, and the command says so."""
    from safetensors.torch import load_file, save_file

    run = ["run", "--algos", "grpo", "--seeds", "0", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
           "--eval-problems", "4", "--eval-every", "1", "--max-new-tokens", "8", "--samples-every", "0",
           "--workers", "1", "--no-progress", "--no-report", "--no-controls"]
    rc, _, err = bench_here(run, tmp_path)
    assert rc == 0, err[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp_id = client.get_experiment_by_name("pobench").experiment_id
    (train,) = client.search_runs([exp_id], "tags.`pobench.kind` = 'train'")
    cid = train.data.tags["pobench.comparison"]
    args = ["eval", "--comparison", cid, "--benchmarks", "arith", "--limit", "4", "--max-new-tokens", "8"]
    rc, _, err = bench_here(args, tmp_path)
    assert rc == 0 and "0 stored, 1 to evaluate" in err, err[-3000:]
    rc, _, err = bench_here(args, tmp_path)  # the same weights: reused
    assert rc == 0 and "1 stored, 0 to evaluate" in err, err[-3000:]

    weights = tmp_path / ".pobench" / "runs" / "pobench" / train.info.run_name / "final" / "model.safetensors"
    tensors = load_file(weights)
    name = next(iter(tensors))
    tensors[name] = tensors[name] * 0 + 1  # the final weights replaced, as the user did
    save_file(tensors, weights, metadata={"format": "pt"})
    rc, _, err = bench_here(args, tmp_path)
    assert rc == 0, err[-3000:]
    assert "0 stored, 1 to evaluate" in err, err[-3000:]
    assert "1 stored evaluation(s) were of other final weights" in err and f"{train.info.run_name} on arith" in err
    evals = client.search_runs([exp_id], "tags.`pobench.kind` = 'eval'", order_by=["attributes.start_time DESC"])
    assert len(evals) == 2 and evals[0].data.tags["pobench.final_digest"] != evals[1].data.tags["pobench.final_digest"]
    rc, _, err = bench_here(args, tmp_path)  # the new weights' evaluation is reused in turn
    assert rc == 0 and "1 stored, 0 to evaluate" in err, err[-3000:]
