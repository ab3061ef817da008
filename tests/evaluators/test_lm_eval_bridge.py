"""A real lm-evaluation-harness run on the tiny model over a few rows of two benchmarks, agreeing with `bench eval`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from bench.cli import main
from evaluators import get_benchmark
from evaluators.lm_eval_bridge import write_tasks
from tests.evaluators.tiny_model import tiny_model_dir

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory, seed=1)


def _gsm8k_rows(path: Path) -> None:
    """A few short real GSM8K test rows (the tiny model's context is short), or hand-made ones without the data."""
    source = DATA / "gsm8k" / "test.jsonl"
    if source.is_file():
        rows = [r for r in map(json.loads, source.read_text().splitlines()) if len(r["question"]) < 140][:3]
    else:
        rows = [{"question": f"Ann has {a} pens. She gets {b} more. How many pens now?",
                 "answer": f"{a}+{b}={a + b}\n#### {a + b}"} for a, b in ((2, 3), (10, 7), (31, 4))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_task_yaml_uses_local_json_and_our_hooks(tmp_path):
    b = get_benchmark("arith", difficulty=1)
    problems = b.load(limit=2)
    names = write_tasks([(b, problems, ["P1", "P2"])], tmp_path, max_new_tokens=16)
    assert names == ["pobench_arith"]
    text = (tmp_path / "pobench_arith.yaml").read_text()
    assert "!function utils.extract" in text and "!function utils.process_results" in text
    config = yaml.safe_load(text.replace("!function ", ""))
    assert config["dataset_path"] == "json"
    assert config["dataset_kwargs"]["data_files"]["test"] == str(tmp_path / "pobench_arith.jsonl")
    assert config["generation_kwargs"]["do_sample"] is False
    rows = [json.loads(x) for x in (tmp_path / "pobench_arith.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["P1", "P2"] and rows[0]["answer"] == problems[0].answer


@pytest.mark.slow
def test_lm_eval_agrees_with_bench_eval(model_dir, tmp_path, capsys):
    data = tmp_path / "gsm8k.jsonl"
    _gsm8k_rows(data)
    out = tmp_path / "out"
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the CPU is shared; one thread is fastest for a tiny model
    try:
        code = main(["eval", "--model", model_dir, "--benchmarks", "gsm8k,arith", "--data", f"gsm8k={data}",
                     "--limit", "3", "--temperature", "0", "--max-new-tokens", "24", "--harness", "lm-eval",
                     "--no-mlflow", "--out", str(out)])
    finally:
        torch.set_num_threads(before)
    printed = capsys.readouterr().out
    assert code == 0
    assert "lm_eval_acc" in printed
    results = json.loads((out / "results.json").read_text())
    for b in results["benchmarks"]:
        comparison = b["lm_eval"]
        assert comparison["rows"] == 3
        assert comparison["same_prompts"] == 3, "lm-eval must see exactly our prompts"
        assert comparison["same_completions"] == 3, comparison["disagreements"]
        assert comparison["disagreements"] == [] and comparison["truncated"] == []
        assert comparison["lm_eval_acc"] == pytest.approx(b["metrics"]["greedy_acc"]["value"])
    assert (out / "lm_eval" / "pobench_gsm8k.yaml").is_file()
