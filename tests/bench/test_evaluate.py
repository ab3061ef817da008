"""`bench.evaluate` and `bench eval` on a real tiny model: metric bookkeeping, outputs, MLflow runs, bad input."""

from __future__ import annotations

import json
import os

import pytest
import torch

from bench.cli import main
from bench.evaluate import evaluate, log_to_mlflow
from bench.model import load_policy
from bench.rollout import make_sampler
from evaluators import get_benchmark
from evaluators.verify import is_correct
from tests.evaluators.tiny_model import tiny_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, seed=0)


@pytest.fixture(autouse=True)
def one_thread_and_own_tracking_uri(monkeypatch):
    """The CPU is shared: one intra-op thread is much faster than two oversubscribed ones for a tiny model.
    MLflow's tracking URI is process-global (``mlflow.set_tracking_uri`` sets it and $MLFLOW_TRACKING_URI): both
    are put back as they were after each test. (Setting back the resolved default instead pinned every later test
    of the process to ./mlflow.db of the folder pytest started in.)"""
    from mlflow.tracking._tracking_service import utils

    monkeypatch.setattr(utils, "_tracking_uri", utils._tracking_uri)
    env = os.environ.get("MLFLOW_TRACKING_URI")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    if env is not None:
        os.environ["MLFLOW_TRACKING_URI"] = env


def test_evaluate_bookkeeping_matches_the_verifier(model_dir):
    model, tok = load_policy(model_dir)
    engine = make_sampler("hf", model, tok)
    bench = get_benchmark("arith", difficulty=1)
    problems = bench.load("test", limit=6)
    r = evaluate(engine, tok, bench, problems, k=2, n_samples=3, temperature=1.0, seed=3, max_new_tokens=16)
    assert set(r.metrics) == {"greedy_acc", "pass@1", "pass@2", "maj@2"}
    assert len(r.rows) == 6 and r.n_samples == 3
    for row, p in zip(r.rows, problems):
        assert row["greedy_correct"] == is_correct(row["greedy_completion"], p.answer, "number")
        assert row["sample_correct"] == [is_correct(c, p.answer, "number") for c in row["sample_completions"]]
    assert r.metrics["greedy_acc"].value == pytest.approx(sum(x["greedy_correct"] for x in r.rows) / 6)
    assert r.metrics["pass@1"].value == pytest.approx(sum(x["n_correct"] for x in r.rows) / 18)
    for m in r.metrics.values():
        assert m.ci_low <= m.value <= m.ci_high
    again = evaluate(engine, tok, bench, problems, k=2, n_samples=3, temperature=1.0, seed=3, max_new_tokens=16)
    assert [x["sample_completions"] for x in again.rows] == [x["sample_completions"] for x in r.rows]  # seeded
    flat = r.flat_metrics()
    assert "eval/arith/pass_at_2" in flat and "eval/arith/maj_at_2_ci_high" in flat
    with pytest.raises(ValueError, match="k <= n_samples"):
        evaluate(engine, tok, bench, problems, k=4, n_samples=2)


@pytest.mark.slow
def test_nested_mlflow_run(model_dir, mlflow_server):
    import mlflow

    model, tok = load_policy(model_dir)
    bench = get_benchmark("arith", difficulty=1)
    r = evaluate(make_sampler("hf", model, tok), tok, bench, bench.load(limit=3), k=0, n_samples=0,
                 max_new_tokens=8)
    uri = mlflow_server
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("pobench-test")
    with mlflow.start_run(run_name="train") as parent:  # a fluent active run ...
        child_id = log_to_mlflow([r], params={"model": model_dir}, tracking_uri=uri, step=5)
    client = mlflow.MlflowClient(uri)
    trainer_run = client.create_run(parent.info.experiment_id, run_name="client-run")  # ... or an explicit parent
    second_id = log_to_mlflow([r], params={}, tracking_uri=uri, parent_run_id=trainer_run.info.run_id)
    assert client.get_run(second_id).data.tags["mlflow.parentRunId"] == trainer_run.info.run_id
    child = mlflow.get_run(child_id)
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.tags["pobench.kind"] == "eval"
    assert child.data.metrics["eval/arith/greedy_acc"] == r.metrics["greedy_acc"].value
    history = client.get_metric_history(child_id, "eval/arith/greedy_acc")
    assert [h.step for h in history] == [5]


@pytest.mark.slow
def test_bench_eval_cli_writes_outputs_and_logs_to_mlflow(model_dir, tmp_path, mlflow_server, capsys):
    import mlflow

    rows = [{"question": "Ann has 2 pens. She gets 3 more. How many pens now?", "answer": "2+3=5\n#### 5"},
            {"question": "Bob has 7 cards. He gets 1 more. How many cards now?", "answer": "7+1=8\n#### 8"}]
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    code = main(["eval", "--model", model_dir, "--benchmarks", "gsm8k,arith", "--data", f"gsm8k={data}",
                 "--k", "2", "--limit", "2", "--max-new-tokens", "12", "--out", str(out),
                 "--tracking-uri", mlflow_server, "--experiment", "eval-cli-test", "--run-name", "cli"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "greedy_acc" in printed and "pass@2" in printed and "maj@2" in printed
    results = json.loads((out / "results.json").read_text())
    assert [b["benchmark"] for b in results["benchmarks"]] == ["gsm8k", "arith"]
    assert all(len(b["rows"]) == 2 for b in results["benchmarks"])
    assert (out / "gsm8k.csv").read_text().startswith("id,reference,greedy_answer")
    runs = mlflow.MlflowClient(mlflow_server).search_runs(
        [mlflow.MlflowClient(mlflow_server).get_experiment_by_name("eval-cli-test").experiment_id])
    assert len(runs) == 1 and "eval/gsm8k/pass_at_2" in runs[0].data.metrics


def test_bench_eval_bad_input(capsys):
    assert main(["eval", "--model", "builtin:tiny-arith", "--benchmarks", "gsm8k,mathh"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'mathh' (did you mean 'math'?)" in err and "valid: gsm8k, math, math500" in err


def test_bench_eval_malformed_data(tmp_path, capsys):
    data = tmp_path / "test.jsonl"
    data.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    assert main(["eval", "--model", "builtin:tiny-arith", "--benchmarks", "gsm8k", "--data", str(data)]) == 2
    assert f"{data}:2: malformed JSONL row" in capsys.readouterr().err


def test_bench_eval_skip_bad_rows_counts_them(model_dir, tmp_path, capsys):
    data = tmp_path / "test.jsonl"
    data.write_text('{"question": "Ann has 1 pen. She gets 1 more. How many pens now?", "answer": "#### 2"}\n'
                    '{not json\n{"question": "no answer here"}\n')
    code = main(["eval", "--model", model_dir, "--benchmarks", "gsm8k", "--data", str(data), "--skip-bad-rows",
                 "--temperature", "0", "--max-new-tokens", "4", "--no-mlflow", "--out", str(tmp_path / "out")])
    assert code == 0
    assert "gsm8k: skipped 2 bad row(s)" in capsys.readouterr().err
    assert len(json.loads((tmp_path / "out" / "results.json").read_text())["benchmarks"][0]["rows"]) == 1


def test_bench_eval_without_model_evaluates_the_builtin_model(tmp_path, capsys):
    """As a new user types it: no --model means the built-in model, as for `bench train` / `bench run`."""
    out = tmp_path / "out"
    code = main(["eval", "--benchmarks", "arith", "--limit", "3", "--temperature", "0", "--max-new-tokens", "16",
                 "--no-mlflow", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["model"] == "builtin:tiny-arith"
    assert len(results["benchmarks"][0]["rows"]) == 3
    assert results["benchmarks"][0]["metrics"]["greedy_acc"]["value"] > 0  # the warm-started model solves arith
