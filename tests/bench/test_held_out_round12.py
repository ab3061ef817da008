"""Held-out round 12: a check of plain `bench eval` that `--comparison` skipped, a report's note on a pair whose process
is gone, a child a plugin starts while training: each said in one line, as their round-11 counterparts are."""

from __future__ import annotations

import json
import shutil

from tests.conftest import fresh_store


# ------------------------------------------------------------------ H01: `bench eval --comparison`, a row too long
def _comparison_with_a_final_model(tmp_path, uri: str) -> str:
    """A hand-made comparison `c1` (experiment pobench) of one grpo run whose final model (the built-in tiny model's
    files) lies where `bench run` leaves it, ``<output_dir>/<run name>/final``. -> the run's id."""
    from mlflow import MlflowClient

    from bench.model import resolve_model_path
    from reports.record import get_or_create_experiment
    from tests.reports.conftest import log_run

    client = MlflowClient(tracking_uri=uri)
    exp_id = get_or_create_experiment(client, uri, "pobench")
    rid = log_run(client, exp_id, "grpo", 0, "c1")
    out = tmp_path / ".pobench" / "runs" / "pobench"
    client.log_param(rid, "output_dir", str(out))
    shutil.copytree(resolve_model_path("builtin:tiny-arith"), out / "grpo-s0" / "final")
    run = client.create_run(exp_id, run_name="comparison-c1", tags={
        "pobench.kind": "comparison", "pobench.comparison": "c1", "pobench.config_hash": "cfg000000001",
        "pobench.objectives": "grpo", "pobench.seeds": "0", "pobench.baseline": "grpo"})
    client.set_terminated(run.info.run_id)
    return rid


def test_eval_comparison_refuses_a_row_longer_than_the_model_s_context_naming_it(tmp_path, bench_here):
    """Held-out round 12 (H01): `bench eval --comparison` on a JSONL whose one row is longer than the final models'
    context evaluated it with a warning and stored the result (`--skip-bad-rows` had no effect); plain `bench eval`
    refuses it naming `file:line` (round 11, H03). Now `--comparison` runs the same check, before any model loads:
    one line, exit 2, nothing evaluated; with --skip-bad-rows the row is skipped, counted, and the rest evaluated."""
    from mlflow import MlflowClient

    uri = fresh_store(tmp_path)
    rid = _comparison_with_a_final_model(tmp_path, uri)
    rows = "".join(json.dumps({"question": f"What is {i}+1?" + (" x" * 2000 if i == 1 else ""), "answer": str(i + 1)})
                   + "\n" for i in range(3))
    (tmp_path / "d.jsonl").write_text(rows)
    args = ["eval", "--comparison", "c1", "--benchmarks", "gsm8k", "--data", "d.jsonl", "--tracking-uri", uri,
            "--temperature", "0", "--max-new-tokens", "4"]
    rc, out, err = bench_here(args, tmp_path)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[-3000:])
    assert lines[0].startswith("bench eval: error: d.jsonl:2: its prompt is") and "context of 256 tokens" in lines[0] \
        and "--skip-bad-rows" in lines[0], lines[0]
    client = MlflowClient(tracking_uri=uri)
    evals = lambda: client.search_runs([client.get_run(rid).info.experiment_id], "tags.`pobench.kind` = 'eval'")  # noqa: E731
    assert evals() == [] and not (tmp_path / ".pobench" / "eval").exists()

    rc, out, err = bench_here([*args, "--skip-bad-rows"], tmp_path)
    assert rc == 0, err[-3000:]
    assert "gsm8k: skipped 1 row(s) whose prompt is not shorter than the model's context of 256 tokens: d.jsonl:2" \
        in err, err
    assert "Traceback" not in err and "exceed the model's context" not in err, err
    (e,) = evals()
    assert e.data.tags["mlflow.parentRunId"] == rid
    table = (tmp_path / ".pobench" / "eval" / "c1" / "grpo-s0" / "gsm8k" / "gsm8k.csv").read_text()
    assert len(table.splitlines()) == 1 + 2, table  # (the header and the two rows that fit)

