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
TEST_FILES = [f for f in FILES if f[1] == "test"]
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


@pytest.mark.skipif(not DATA.is_dir(), reason=f"real data files not found at {DATA} (../shared/data)")
@pytest.mark.parametrize("name, split", TEST_FILES, ids=[n for n, _ in TEST_FILES])
def test_wrong_answers_on_real_rows(name, split):
    """Off-by-one numbers on every numeric row, and (LaTeX benchmarks) another row's answer, are judged wrong."""
    from evaluators.verify import normalize_latex, to_number

    benchmark = get_benchmark(name)
    problems = benchmark.load(split, data=DATA / name / f"{split}.jsonl")
    kind = benchmark.answer_kind
    numeric = [p for p in problems if to_number(p.answer) is not None]
    false_positives = [p.id for p in numeric
                       if is_correct(f"So the answer is $\\boxed{{{to_number(p.answer) + 1}}}$.", p.answer, kind)]
    assert not false_positives, f"off-by-one judged correct: {false_positives[:10]}"
    if kind == "latex":
        symbolic = [p for p in problems if to_number(p.answer) is None][:15]  # math-verify: ~1 s each
        swapped = [(a, b) for a, b in zip(symbolic, symbolic[1:] + symbolic[:1])
                   if normalize_latex(a.answer) != normalize_latex(b.answer)]
        wrong = [a.id for a, b in swapped if is_correct(f"\\boxed{{{b.answer}}}", a.answer, kind)]
        assert len(wrong) <= 1, f"another row's answer judged correct: {wrong}"
