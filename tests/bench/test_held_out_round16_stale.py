"""Held-out round 16 (issue 29): two stale results silently reused: a comparison's pair trained while its plugin
imported a helper by a computed name, the helper edited since (H09); a benchmark evaluation of a data file whose
reference answers were rewritten since (H10). Neither is reused now."""

from __future__ import annotations

import json

from tests.bench.test_held_out_round12 import _comparison_with_a_final_model
from tests.conftest import fresh_store


# ------------------------------------------------------------------ H10: a rewritten benchmark file
def test_a_rewritten_benchmark_file_is_evaluated_again_and_the_report_takes_the_new_result(tmp_path, bench_here):
    """H10: `bench eval --comparison ID --benchmarks gsm8k --data gsm8k=d.jsonl --limit 4`, then every reference
    answer of d.jsonl rewritten (`#### 0` -> `#### 90`), the same command: `1 stored, 0 to evaluate`, the results
    against the old answers reused. Now the eval key covers the problems by content: the rewritten file is evaluated
    again (a new key; the old evaluation stays in the store), the same file once more is reused, and the report's
    benchmark table takes the newest."""
    from mlflow import MlflowClient

    from reports.evals import chosen, load_evals
    from reports.load import load_comparison

    uri = fresh_store(tmp_path)
    rid = _comparison_with_a_final_model(tmp_path, uri)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i}+{i}?", "answer": f"{i}+{i}={2 * i}\n#### 0"}) + "\n"
                            for i in range(4)))
    args = ["eval", "--comparison", "c1", "--benchmarks", "gsm8k", "--data", "gsm8k=d.jsonl", "--limit", "4",
            "--tracking-uri", uri, "--temperature", "0", "--max-new-tokens", "2"]
    rc, _, err = bench_here(args, tmp_path)
    assert rc == 0 and "1 runs x 1 benchmarks; 0 stored, 1 to evaluate" in err, err[-3000:]

    data.write_text(data.read_text().replace("#### 0", "#### 90"))
    rc, _, err = bench_here(args, tmp_path)
    assert rc == 0 and "1 runs x 1 benchmarks; 0 stored, 1 to evaluate" in err, err[-3000:]
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.get_run(rid).info.experiment_id
    evals = client.search_runs([exp_id], "tags.`pobench.kind` = 'eval'", order_by=["attributes.start_time ASC"])
    assert len(evals) == 2 and len({e.data.tags["pobench.eval_key"] for e in evals}) == 2  # (the old one kept)

    rc, _, err = bench_here(args, tmp_path)  # the same file again: reused
    assert rc == 0 and "1 stored, 0 to evaluate" in err, err[-3000:]
    cmp = load_comparison("pobench", "c1", uri, client=client, with_series=False)
    assert chosen(load_evals(client, cmp))["gsm8k"][rid].run_id == evals[-1].info.run_id
