"""Benchmark registry and loaders: every local format, field mapping, and clear errors on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evaluators import BadRowError, Problem, get_benchmark, list_benchmarks
from evaluators.benchmarks import task_module

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"real data files not found at {DATA} (../shared/data)")


def test_registry_lists_every_benchmark_with_a_version():
    names = list_benchmarks()
    assert names == ["gsm8k", "math", "math500", "aime24", "aime25", "amc23", "minerva_math", "olympiadbench", "arith"]
    for name in names[:-1]:
        b = get_benchmark(name)
        assert b.name == name and b.version and b.answer_kind in ("number", "integer", "latex") and b.hub_id


def test_unknown_benchmark_lists_valid_names_and_suggests():
    with pytest.raises(ValueError) as err:
        get_benchmark("math50")
    assert "did you mean 'math500'?" in str(err.value)
    assert "valid: gsm8k, math, math500, aime24, aime25, amc23, minerva_math, olympiadbench, arith" in str(err.value)


def test_arith_is_registered_lazily():
    b = get_benchmark("arith", difficulty=1)
    problems = b.load("test", limit=5)
    assert len(problems) == 5 and all(isinstance(p, Problem) for p in problems)
    assert all(b.reward(p.solution, p) == 1.0 for p in problems)
    assert b.reward("#### -1", problems[0]) == 0.0


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GSM = [{"question": "Ann has 2 pens and gets 3 more. How many?", "answer": "2+3=<<2+3=5>>5\n#### 5"},
       {"question": "Bob has 1,000 coins and spends 1. How many?", "answer": "1000-1=999\n#### 999"}]


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = _write_jsonl(tmp_path / "test.jsonl", [GSM[0], '{"question": "broken', GSM[1]])
    with pytest.raises(BadRowError, match=rf"{path}:2: malformed JSONL row.*--skip-bad-rows"):
        get_benchmark("gsm8k").load(data=path)
    problems, source = get_benchmark("gsm8k").load_rows(data=path, skip_bad_rows=True)
    assert [p.answer for p in problems] == ["5", "999"]
    assert len(source.skipped) == 1 and f"{path}:2" in source.skipped[0]


def test_row_without_answer_field_names_field_and_fields_present(tmp_path):
    path = _write_jsonl(tmp_path / "test.jsonl", [GSM[0], {"question": "q?", "solution": "s", "idx": 3}])
    with pytest.raises(BadRowError) as err:
        get_benchmark("gsm8k").load(data=path)
    msg = str(err.value)
    assert f"{path}:2" in msg and "'answer'" in msg and "fields present: idx, question, solution" in msg
    math_path = _write_jsonl(tmp_path / "math.jsonl", [{"problem": "p", "solution": "no box here", "level": "1"}])
    with pytest.raises(BadRowError, match=r"'answer' \(or a \\boxed\{\} in 'solution'\); fields present: level, "):
        get_benchmark("math").load(data=math_path)


def test_gsm8k_answer_without_marker_is_an_error(tmp_path):
    path = _write_jsonl(tmp_path / "test.jsonl", [{"question": "q", "answer": "it is five"}])
    with pytest.raises(BadRowError, match="no '#### N' final-answer marker"):
        get_benchmark("gsm8k").load(data=path)


def test_json_parquet_and_folder_layouts(tmp_path):
    import pandas as pd

    (tmp_path / "list.json").write_text(json.dumps(GSM))
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": GSM}))
    pd.DataFrame(GSM).to_parquet(tmp_path / "rows.parquet")
    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    pd.DataFrame(GSM[:1]).to_parquet(hub / "test-00000-of-00002.parquet")
    pd.DataFrame(GSM[1:]).to_parquet(hub / "test-00001-of-00002.parquet")
    per_problem = tmp_path / "MATH" / "test" / "algebra"
    per_problem.mkdir(parents=True)
    for i in (2, 10, 1):
        (per_problem / f"{i}.json").write_text(json.dumps({"problem": f"p{i}", "solution": f"\\boxed{{{i}}}"}))
    gsm = get_benchmark("gsm8k")
    for data in ("list.json", "wrapped.json", "rows.parquet", "hub"):
        assert [p.answer for p in gsm.load(data=tmp_path / data)] == ["5", "999"], data
    assert [p.answer for p in get_benchmark("math").load(data=tmp_path / "MATH")] == ["1", "2", "10"]
    with pytest.raises(FileNotFoundError, match="no data for split 'train'"):
        gsm.load("train", data=tmp_path / "hub")
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        gsm.load(data=tmp_path / "missing.jsonl")


def test_limit_and_unknown_split(tmp_path):
    path = _write_jsonl(tmp_path / "test.jsonl", GSM)
    assert len(get_benchmark("gsm8k").load(data=path, limit=1)) == 1
    with pytest.raises(ValueError, match="has no split 'train'; valid: test"):
        get_benchmark("aime24").load("train")


@needs_data
@pytest.mark.parametrize("name, split, rows, first_answer", [
    ("gsm8k", "test", 1319, "18"), ("gsm8k", "train", 7473, "72"), ("math", "test", 5000, "2"),
    ("math", "train", 7498, "0"), ("math500", "test", 500, "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("aime24", "test", 30, "204"), ("amc23", "test", 40, "27"), ("minerva_math", "test", 272, "1.6"),
    ("olympiadbench", "test", 675, "2"),
])
def test_every_real_file_loads(name, split, rows, first_answer):
    problems = get_benchmark(name).load(split, data=DATA / name)
    assert len(problems) == rows
    assert problems[0].answer == first_answer
    assert all(p.question.strip() and p.answer.strip() for p in problems)
    assert len({p.id for p in problems}) == rows


@needs_data
def test_field_mapping_details():
    ob = {p.id: p for p in get_benchmark("olympiadbench").load(data=DATA / "olympiadbench")}
    assert ob["1664"].answer == "69, 84"  # "$69$,$84$": a list of math spans
    assert all("$" not in p.answer for k, p in ob.items() if k not in ("1965", "2349"))  # two malformed rows
    aime = get_benchmark("aime24").load(data=DATA / "aime24")
    assert [p.answer for p in aime][:8] == ["204", "113", "371", "385", "110", "104", "721", "25"]
    assert get_benchmark("math").load(data=DATA / "math" / "test.jsonl")[0].id == "test/algebra/1.json"


def test_offline_hub_error_suggests_data():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "POBENCH_DATA_DIR": ""}
    code = "from evaluators import get_benchmark; get_benchmark('aime25').load()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode != 0
    assert "math-ai/aime25" in proc.stderr and "--data PATH" in proc.stderr


def test_docs_describe_every_benchmark_and_version():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "EVALUATORS.md").read_text()
    for name in list_benchmarks():
        if task_module(name) != "evaluators":  # a plugin's task (loaded by another test in this process): its own docs
            continue
        b = get_benchmark(name)
        assert f"| `{name}` | {b.version} |" in doc, f"docs/EVALUATORS.md lacks {name} version {b.version}"
        if getattr(b, "hub_id", None):
            assert f"`{b.hub_id}`" in doc


def test_data_dir_environment_variable(tmp_path, monkeypatch):
    (tmp_path / "gsm8k").mkdir()
    _write_jsonl(tmp_path / "gsm8k" / "test.jsonl", GSM)
    monkeypatch.setenv("POBENCH_DATA_DIR", str(tmp_path))
    assert [p.answer for p in get_benchmark("gsm8k").load()] == ["5", "999"]


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_utf8_bom_files_are_read(tmp_path, suffix):
    """A UTF-8 byte-order mark (Windows editors write one) is not a malformed row."""
    path = tmp_path / f"test{suffix}"
    body = "".join(json.dumps(r) + "\n" for r in GSM) if suffix == ".jsonl" else json.dumps(GSM)
    path.write_bytes(b"\xef\xbb\xbf" + body.replace("\n", "\r\n").encode("utf-8"))
    problems = get_benchmark("gsm8k").load(data=path)
    assert [p.answer for p in problems] == ["5", "999"]
    assert problems[0].question.startswith("Ann")
