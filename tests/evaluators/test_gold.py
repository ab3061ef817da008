"""Gold self-consistency on the real data files: each row's own reference solution (or reference answer), given to
the verifier as if it were the model's completion, must be judged correct for >= 99% of the rows of every file.

This checks extraction on the real formats: GSM8K's ``#### N``, MATH's nested ``\\boxed{}``, OlympiadBench's
``$...$`` lists, AMC's floats. Rows the loader drops (an empty reference answer) count as failures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluators import get_benchmark
from evaluators.verify import extract_answer, is_correct

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

# (benchmark, split); files whose final answer is only in an answer field name that field: the completion is then
# "The final answer is <that field as the source writes it>."
FILES = [("gsm8k", "test"), ("gsm8k", "train"), ("math", "test"), ("math", "train"), ("math500", "test"),
         ("aime24", "test"), ("amc23", "test"), ("minerva_math", "test"), ("olympiadbench", "test")]
ANSWER_ONLY = {"aime24": "answer", "amc23": "answer", "olympiadbench": "final_answer"}


def _gold_completion(name: str, raw_row: dict, solution: str | None) -> str:
    if name not in ANSWER_ONLY:
        return solution or ""
    raw = raw_row[ANSWER_ONLY[name]]
    return f"The final answer is {', '.join(raw) if isinstance(raw, list) else raw}."


@pytest.mark.skipif(not DATA.is_dir(), reason=f"real data files not found at {DATA} (../shared/data)")
@pytest.mark.parametrize("name, split", FILES, ids=[f"{n}/{s}" for n, s in FILES])
def test_gold_self_consistency(name, split, capsys):
    path = DATA / name / f"{split}.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    benchmark = get_benchmark(name)
    raw_rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    problems, source = benchmark.load_rows(split, data=path)
    failures = [f"{w}: dropped by the loader" for w in source.skipped]
    correct = 0
    for problem, where in zip(problems, source.where):
        raw = raw_rows[int(where.rsplit(":", 1)[1]) - 1]
        completion = _gold_completion(name, raw, problem.solution)
        if is_correct(completion, problem.answer, benchmark.answer_kind):
            correct += 1
        else:
            failures.append(f"{where}: reference {problem.answer!r}, "
                            f"extracted {extract_answer(completion, benchmark.answer_kind)!r}")
    rate = correct / len(raw_rows)
    with capsys.disabled():
        print(f"\n[gold] {name}/{split}: {correct}/{len(raw_rows)} = {rate:.2%} judged correct")
        for failure in failures:
            print(f"[gold]   FAIL {failure}")
    assert len(problems) + len(source.skipped) == len(raw_rows)
    assert rate >= 0.99, f"{name}/{split}: only {rate:.2%} of gold completions judged correct"
